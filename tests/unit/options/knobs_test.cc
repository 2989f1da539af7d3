// The knob rows (options/knobs.h): a row that lacks a part is refused by name, the describer and grid conversions
// read the rows, and the README's knob table is the generated one.
#include "options/knobs.h"

#include <gtest/gtest.h>

#include "tests/unit/readme_section.h"


namespace commsched {
namespace {

constexpr double kGrid[] = {0, 64 * 1024.0};

// A complete searched row: a byte-sized knob with an off band, as small_tensor_bytes is.
KnobSpec complete_row() {
  return {.name = "probe_bytes",
          .alias = "probe",
          .field = &Knobs::small_tensor_bytes,
          .zero = ZeroSize::off,
          .doc = "a probe",
          .tuning = {KnobScale::log_bytes, 4096, 1 << 20, 4096, {}, false, false, true},
          .ps = {kGrid},
          .allreduce = {kGrid},
          .grid_flag = "probes"};
}

std::string refusal(std::span<const KnobSpec> rows) {
  try {
    check_knob_registry(rows);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(KnobRows, TheRegisteredRowsAreComplete) {
  EXPECT_TRUE(check_knob_registry(kKnobs));
  for (const KnobSpec& k : kKnobs) EXPECT_EQ(registered_knob(k.name).field, k.field) << k.name;
  EXPECT_THROW(registered_knob("no_such_knob"), InvalidArgument);
}

// Each part a row must have, taken away in turn, is named in the refusal.
TEST(KnobRows, AnIncompleteRowIsRefusedByName) {
  EXPECT_EQ(refusal(std::vector<KnobSpec>{complete_row()}), "");
  struct Case {
    const char* what;
    void (*remove)(KnobSpec&);
  };
  const Case cases[] = {
      {"alias", [](KnobSpec& k) { k.alias = {}; }},
      {"Knobs field", [](KnobSpec& k) { k.field = nullptr; }},
      {"doc", [](KnobSpec& k) { k.doc = {}; }},
      {"grid flag", [](KnobSpec& k) { k.grid_flag = {}; }},
      {"empty simulator grid", [](KnobSpec& k) { k.allreduce = {}; }},
      {"tuning bounds", [](KnobSpec& k) { k.tuning.max = 1024; }},
      {"alignment", [](KnobSpec& k) { k.tuning.alignment = 0; }},
      {"outside its range", [](KnobSpec& k) { k.tuning.off_band = false; }},  // the grid's 0 has no band then
      {"multiple of", [](KnobSpec& k) { k.tuning.scale = KnobScale::log_multiple; }},
  };
  for (const Case& c : cases) {
    KnobSpec k = complete_row();
    c.remove(k);
    const std::string why = refusal(std::vector<KnobSpec>{k});
    EXPECT_NE(why.find("'probe_bytes'"), std::string::npos) << c.what << ": " << why;
    EXPECT_NE(why.find(c.what), std::string::npos) << c.what << ": " << why;
  }
  KnobSpec nameless = complete_row();
  nameless.name = {};
  EXPECT_NE(refusal(std::vector<KnobSpec>{nameless}).find("no name"), std::string::npos);
  EXPECT_NE(refusal(std::vector<KnobSpec>{complete_row(), complete_row()}).find("repeats"), std::string::npos);
  // A row that is not searched needs no axis, grid or flag.
  KnobSpec fixed = complete_row();
  fixed.tuning = {};
  fixed.ps = fixed.allreduce = {};
  fixed.grid_flag = {};
  EXPECT_EQ(refusal(std::vector<KnobSpec>{fixed}), "");
}

TEST(KnobRows, TheDescriberReadsTheRows) {
  EXPECT_EQ(describe_knobs(Knobs{1 << 20, 8 << 20, 0}), "partition 1 MiB, credit 8 MiB (8x), small_tensor off");
  EXPECT_EQ(describe_knobs(Knobs{1 << 20, 1, 64 << 10}), "partition 1 MiB, credit one batch in flight, small_tensor 64 KiB");
  EXPECT_EQ(describe_knobs(Knobs{0, 0, 0}, std::span(kKnobs).first(2)), "partition unlimited, credit unlimited");
  EXPECT_EQ(describe_knob(registered_knob("credit_bytes"), Knobs{3 << 20, 67 << 20, 0}), "67 MiB (22.3x)")
      << "a multiple to three digits";
}

TEST(KnobRows, GridValuesAreInTheRowsUnit) {
  const KnobSpec& credit = registered_knob("credit_bytes");
  const Knobs k{1 << 20, 0, 0};
  EXPECT_EQ(knob_value_from_grid(credit, 4, k), 4u << 20) << "a multiple of the partition";
  EXPECT_EQ(knob_value_from_grid(credit, 0, k), 1u) << "multiple 0: one batch in flight";
  EXPECT_EQ(knob_value_from_grid(registered_knob("partition_bytes"), 65536, k), 65536u);
  for (double v : {0.0, 1.0, 4.0}) {
    Knobs with = k;
    with.credit_bytes = knob_value_from_grid(credit, v, k);
    EXPECT_EQ(knob_grid_value(credit, with), v) << "round trip";
  }
}

TEST(KnobRows, TheReadmeTableIsTheGeneratedOne) {
  EXPECT_EQ(testing::readme_section("knobs"), knobs_markdown())
      << "README.md's knob table differs from the rows: replace the lines between <!-- knobs:begin --> and "
         "<!-- knobs:end --> with the output of `build/plugins/commsched options --knobs`";
}

}  // namespace
}  // namespace commsched
