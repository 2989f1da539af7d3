#include <gtest/gtest.h>

#include "scheduler/config.h"
#include "scheduler/types.h"
#include "tuner/search_space.h"
#include "tuner/tuner_config.h"

namespace commsched::tuner {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

TEST(SearchSpace, CornersMapToTheBounds) {
  SearchSpace s;
  const Knobs lo = s.to_knobs(std::vector<double>{0.0, 0.0});
  EXPECT_EQ(lo.partition_bytes, 64 * KiB);
  EXPECT_EQ(lo.credit_bytes, 1u);  // one batch in flight
  // One partition sits exactly at the edge of the one-batch band: 1 of 8 octaves.
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 1.0 / 8.0}).credit_bytes, 64 * KiB);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 0.5 / 8.0}).credit_bytes, 1u);
  const Knobs hi = s.to_knobs(std::vector<double>{1.0, 1.0});
  EXPECT_EQ(hi.partition_bytes, 64 * MiB);
  EXPECT_EQ(hi.credit_bytes, 0u);  // unlimited
  // The largest finite multiple sits exactly at the edge of the unlimited band: 7 of 8 octaves.
  const Knobs edge = s.to_knobs(std::vector<double>{0.0, 7.0 / 8.0});
  EXPECT_EQ(edge.credit_bytes, 64 * 64 * KiB);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 7.5 / 8.0}).credit_bytes, 0u);
}

TEST(SearchSpace, KnobsRoundTripThroughTheUnitSquare) {
  SearchSpace s;
  for (uint64_t p = 64 * KiB; p <= 64 * MiB; p *= 2) {
    for (uint64_t m : {1ull, 2ull, 3ull, 8ull, 64ull, 0ull, 99ull /* one batch in flight */}) {
      const Knobs k{p, m == 99 ? 1 : m * p};
      const auto u = s.from_knobs(k);
      EXPECT_GE(u[0], 0.0);
      EXPECT_LE(u[0], 1.0);
      EXPECT_GE(u[1], 0.0);
      EXPECT_LE(u[1], 1.0);
      const Knobs back = s.to_knobs(u);
      EXPECT_EQ(back.partition_bytes, k.partition_bytes) << p << " x" << m;
      EXPECT_EQ(back.credit_bytes, k.credit_bytes) << p << " x" << m;
    }
  }
}

TEST(SearchSpace, PointsRoundTripUpToRounding) {
  SearchSpace s;
  for (double a = 0.0; a <= 1.0; a += 0.125) {
    for (double b = 1.0 / 8.0; b <= 7.0 / 8.0; b += 0.1) {
      const std::vector<double> u{a, b};
      const auto p = s.snap(u);
      EXPECT_NEAR(p[0], a, 1e-3);  // 4 KiB alignment on a 10-octave axis
      EXPECT_NEAR(p[1], b, 1e-3);
      EXPECT_EQ(s.to_knobs(p).partition_bytes, s.to_knobs(u).partition_bytes);  // snapping is idempotent
    }
  }
}

TEST(SearchSpace, PartitionsAreAlignedAndMonotone) {
  SearchSpace s;
  uint64_t prev = 0;
  for (int i = 0; i <= 100; ++i) {
    const uint64_t p = s.to_values(std::vector<double>{i / 100.0, 0.0}).at(0);
    EXPECT_EQ(p % 4096, 0u);
    EXPECT_GE(p, prev);
    prev = p;
  }
}

TEST(SearchSpace, OutOfRangeKnobsAreClamped) {
  SearchSpace s;
  const auto u = s.from_knobs(Knobs{1 * KiB, 1024 * MiB});
  EXPECT_DOUBLE_EQ(u[0], 0.0);
  EXPECT_NEAR(u[1], 7.0 / 8.0, 1e-12);  // a huge finite credit stays finite: the largest multiple
}

TEST(SearchSpace, WithoutUnlimitedTheTopIsTheLargestMultiple) {
  SearchSpaceBounds b;
  b.allow_unlimited_credit = false;
  b.max_credit_multiple = 16;
  SearchSpace s(b);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 1.0}).credit_bytes, 16 * 64 * KiB);
  EXPECT_DOUBLE_EQ(s.from_knobs(Knobs{64 * KiB, 0}).at(1), 1.0);
}

TEST(SearchSpace, BoundsAreConfigurableAndValidated) {
  SearchSpaceBounds b;
  EXPECT_TRUE(b.set("min_partition", "256KiB"));
  EXPECT_TRUE(b.set("max_partition", "8MiB"));
  EXPECT_TRUE(b.set("max_credit_multiple", "16"));
  EXPECT_FALSE(b.set("no_such_option", "1"));
  SearchSpace s(b);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 0.0}).partition_bytes, 256 * KiB);
  EXPECT_EQ(s.to_knobs(std::vector<double>{1.0, 0.0}).partition_bytes, 8 * MiB);

  b.max_partition_bytes = 128 * KiB;  // below the minimum
  try {
    SearchSpace bad(b);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_TUNER_MAX_PARTITION"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b.set("max_credit_multiple", "0.5"), InvalidArgument);
  EXPECT_THROW(SearchSpace().to_knobs(std::vector<double>{0.5, -0.1}), InvalidArgument);
}

TEST(SearchSpace, AxesAreTheRegisteredTunableKnobs) {
  SearchSpace s;
  std::vector<std::string_view> tunable;
  for (const KnobSpec& k : kKnobs)
    if (k.tuning.scale != KnobScale::fixed) tunable.push_back(k.name);
  ASSERT_EQ(s.dim(), static_cast<int>(tunable.size()));
  for (int i = 0; i < s.dim(); ++i) EXPECT_EQ(s.axes()[i].knob->name, tunable[i]);
  // The default bounds are the registered ones.
  EXPECT_EQ(SearchSpaceBounds{}.min_partition_bytes, static_cast<uint64_t>(registered_tuning("partition_bytes").min));
  EXPECT_EQ(SearchSpaceBounds{}.max_credit_multiple, registered_tuning("credit_bytes").max);
}

// A third knob registered as tunable is searched without a change to the tuner: it gets an axis, with its own
// bounds, scale and alignment, beside partition and credit, whose behaviour stays as it was.
TEST(SearchSpace, AThirdRegisteredTunableKnobIsSearchedWithinItsBounds) {
  const KnobSpec knobs[] = {
      kKnobs[0],
      kKnobs[1],
      {"fusion_threshold_bytes", "", nullptr, nullptr, "a knob the search space has never heard of",
       {KnobScale::log_bytes, 8.0 * KiB, 2.0 * MiB, 1024, {}, false}},
      {"window_bytes", "", nullptr, nullptr, "a multiple of the third knob, without an unlimited band",
       {KnobScale::log_multiple, 2.0, 8.0, 1, "fusion_threshold_bytes", false}},
  };
  SearchSpace s({}, knobs);
  ASSERT_EQ(s.dim(), 4);
  EXPECT_EQ(s.axes()[2].knob->name, "fusion_threshold_bytes");
  const SearchSpace::Values lo = s.to_values(std::vector<double>{0.0, 0.0, 0.0, 0.0});
  const SearchSpace::Values hi = s.to_values(std::vector<double>{1.0, 1.0, 1.0, 1.0});
  EXPECT_EQ(lo[2], 8 * KiB);
  EXPECT_EQ(hi[2], 2 * MiB);
  EXPECT_EQ(lo[3], 2 * 8 * KiB);
  EXPECT_EQ(hi[3], 8 * 2 * MiB);
  // Partition and credit map exactly as in the default space.
  SearchSpace plain;
  for (double a : {0.0, 0.3, 0.77, 1.0})
    for (double b : {0.0, 0.5, 7.0 / 8.0, 0.95}) {
      const Knobs want = plain.to_knobs(std::vector<double>{a, b});
      const Knobs got = s.to_knobs(std::vector<double>{a, b, 0.4, 0.6});
      EXPECT_EQ(got.partition_bytes, want.partition_bytes);
      EXPECT_EQ(got.credit_bytes, want.credit_bytes);
    }
  uint64_t prev = 0;
  for (int i = 0; i <= 50; ++i) {
    const double u = i / 50.0;
    const SearchSpace::Values v = s.to_values(std::vector<double>{0.5, 0.5, u, 1.0 - u});
    EXPECT_GE(v[2], 8 * KiB);
    EXPECT_LE(v[2], 2 * MiB);
    EXPECT_EQ(v[2] % 1024, 0u);
    EXPECT_GE(v[2], prev);  // monotone along its axis
    prev = v[2];
    EXPECT_GE(v[3], 2 * v[2]);
    EXPECT_LE(v[3], 8 * v[2]);
    EXPECT_NE(v[3], 0u);  // no unlimited band on this axis
    const SearchSpace::Point back = s.from_values(v);
    EXPECT_NEAR(back[2], u, 0.02);
    EXPECT_NEAR(back[3], 1.0 - u, 1e-4);  // rounded to whole bytes
  }
  // Values outside its bounds clamp onto them.
  const SearchSpace::Point clamped = s.from_values(std::vector<uint64_t>{64 * KiB, 64 * KiB, 1, 1ull << 40});
  EXPECT_DOUBLE_EQ(clamped[2], 0.0);
  EXPECT_DOUBLE_EQ(clamped[3], 1.0);
}

TEST(SearchSpace, InconsistentKnobTuningIsNamed) {
  const KnobSpec reversed[] = {{"backwards", "", nullptr, nullptr, "", {KnobScale::log_bytes, 4096, 1024, 1, {}, false}}};
  try {
    SearchSpace s({}, reversed);
    FAIL() << "bounds out of order were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'backwards'"), std::string::npos) << e.what();
  }
  const KnobSpec orphan[] = {{"orphan", "", nullptr, nullptr, "", {KnobScale::log_multiple, 1, 4, 1, "missing", false}}};
  try {
    SearchSpace s({}, orphan);
    FAIL() << "a multiple of an unknown knob was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }
}

// The registry's rules (scheduler/config.h check_knob_registry, a compile-time check of kKnobs): a tunable knob the
// tuner could not apply is a registration error naming it.
TEST(KnobRegistry, ATunableKnobWithoutAKnobsFieldIsRefused) {
  EXPECT_TRUE(check_knob_registry(kKnobs));
  const KnobSpec unapplied[] = {kKnobs[0], {"ghost_bytes", "", nullptr, nullptr, "searched, never applied",
                                            {KnobScale::log_bytes, 4096, 1 << 20, 4096, {}, false}}};
  try {
    check_knob_registry(unapplied);
    FAIL() << "a tunable knob without a Knobs field was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'ghost_bytes'"), std::string::npos) << e.what();
  }
  const KnobSpec fixed[] = {{"fixed_bytes", "", nullptr, nullptr, "not searched", {}}};
  EXPECT_TRUE(check_knob_registry(fixed)) << "a fixed knob needs no field";
}

TEST(TunerOptions, ParsesOptionsAndNamesBadOnes) {
  TunerOptions o;
  o.set("trials", "8");
  o.set("warmup", "1");
  o.set("min_partition", "128KiB");
  o.set("csv", "/tmp/x.csv");
  EXPECT_EQ(o.max_trials, 8);
  EXPECT_EQ(o.warmup_iterations, 1);
  EXPECT_EQ(o.space.min_partition_bytes, 128 * KiB);
  EXPECT_EQ(o.csv_path, "/tmp/x.csv");
  try {
    o.set("trails", "8");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("trails"), std::string::npos);
  }
  EXPECT_THROW(o.set("window", "0"), InvalidArgument);
}

}  // namespace
}  // namespace commsched::tuner
