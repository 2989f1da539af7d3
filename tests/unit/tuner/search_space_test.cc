#include <gtest/gtest.h>

#include <cmath>
#include <span>

#include "options/knobs.h"
#include "base/types.h"
#include "tuner/search_space.h"
#include "tuner/tuner_config.h"

namespace commsched::tuner {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

// Partition and credit alone (the first two registered knobs): their axes' behaviour, independent of the others.
SearchSpace two_knobs(const SearchSpaceBounds& b = {}) { return SearchSpace(b, std::span<const KnobSpec>(kKnobs).first(2)); }

TEST(SearchSpace, CornersMapToTheBounds) {
  SearchSpace s = two_knobs();
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
  SearchSpace s = two_knobs();
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
  SearchSpace s = two_knobs();
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
  SearchSpace s = two_knobs();
  uint64_t prev = 0;
  for (int i = 0; i <= 100; ++i) {
    const uint64_t p = s.to_values(std::vector<double>{i / 100.0, 0.0}).at(0);
    EXPECT_EQ(p % 4096, 0u);
    EXPECT_GE(p, prev);
    prev = p;
  }
}

TEST(SearchSpace, OutOfRangeKnobsAreClamped) {
  SearchSpace s = two_knobs();
  const auto u = s.from_knobs(Knobs{1 * KiB, 1024 * MiB});
  EXPECT_DOUBLE_EQ(u[0], 0.0);
  EXPECT_NEAR(u[1], 7.0 / 8.0, 1e-12);  // a huge finite credit stays finite: the largest multiple
}

TEST(SearchSpace, WithoutUnlimitedTheTopIsTheLargestMultiple) {
  SearchSpaceBounds b;
  b["credit_bytes"].unlimited_band = false;
  b["credit_bytes"].max = 16;
  SearchSpace s = two_knobs(b);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 1.0}).credit_bytes, 16 * 64 * KiB);
  EXPECT_DOUBLE_EQ(s.from_knobs(Knobs{64 * KiB, 0}).at(1), 1.0);
}

TEST(SearchSpace, BoundsAreConfigurableAndValidated) {
  SearchSpaceBounds b;
  EXPECT_TRUE(b.set("min_partition", "256KiB"));
  EXPECT_TRUE(b.set("max_partition", "8MiB"));
  EXPECT_TRUE(b.set("max_credit_multiple", "16"));
  EXPECT_FALSE(b.set("no_such_option", "1"));
  SearchSpace s = two_knobs(b);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 0.0}).partition_bytes, 256 * KiB);
  EXPECT_EQ(s.to_knobs(std::vector<double>{1.0, 0.0}).partition_bytes, 8 * MiB);

  b["partition_bytes"].max = 128 * KiB;  // below the minimum
  try {
    SearchSpace bad(b);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_TUNER_MAX_PARTITION"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b.set("max_credit_multiple", "0.5"), InvalidArgument);
  EXPECT_THROW(two_knobs().to_knobs(std::vector<double>{0.5, -0.1}), InvalidArgument);
}

TEST(SearchSpace, AxesAreTheRegisteredTunableKnobs) {
  SearchSpace s;
  std::vector<std::string_view> tunable;
  for (const KnobSpec& k : kKnobs)
    if (k.tuning.scale != KnobScale::fixed) tunable.push_back(k.name);
  ASSERT_EQ(s.dim(), static_cast<int>(tunable.size()));
  for (int i = 0; i < s.dim(); ++i) EXPECT_EQ(s.axes()[i].knob->name, tunable[i]);
  // The default bounds are the registered ones.
  EXPECT_EQ(SearchSpaceBounds{}["partition_bytes"].min, registered_tuning("partition_bytes").min);
  EXPECT_EQ(SearchSpaceBounds{}["credit_bytes"].max, registered_tuning("credit_bytes").max);
}

// The default space: partition, credit and bytescheduler's fusion bound, the third on a log scale whose bottom band
// means 0 (off), the next octave starting at the registered minimum.
TEST(SearchSpace, TheFusionBoundIsTheThirdAxisWithAnOffBand) {
  SearchSpace s;
  ASSERT_EQ(s.dim(), 3);
  EXPECT_EQ(s.axes()[2].knob->name, "small_tensor_bytes");
  const KnobTuning& t = registered_tuning("small_tensor_bytes");
  ASSERT_TRUE(t.off_band);
  const double band = 1.0 / (std::log2(t.max / t.min) + 1.0);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.5, 0.5, 0.0}).small_tensor_bytes, 0u) << "the off band";
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.5, 0.5, band * 0.9}).small_tensor_bytes, 0u);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.5, 0.5, band}).small_tensor_bytes, static_cast<uint64_t>(t.min));
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.5, 0.5, 1.0}).small_tensor_bytes, static_cast<uint64_t>(t.max));
  uint64_t prev = 0;
  for (int i = 0; i <= 100; ++i) {
    const double u = i / 100.0;
    const Knobs k = s.to_knobs(std::vector<double>{0.3, 0.4, u});
    if (u >= band) {
      EXPECT_GE(k.small_tensor_bytes, static_cast<uint64_t>(t.min)) << u;
      EXPECT_LE(k.small_tensor_bytes, static_cast<uint64_t>(t.max)) << u;
      EXPECT_EQ(k.small_tensor_bytes % t.alignment, 0u) << u;
    }
    EXPECT_GE(k.small_tensor_bytes, prev) << "monotone along its axis";
    prev = k.small_tensor_bytes;
    // The other axes decode as without the third.
    const Knobs two = two_knobs().to_knobs(std::vector<double>{0.3, 0.4});
    EXPECT_EQ(k.partition_bytes, two.partition_bytes);
    EXPECT_EQ(k.credit_bytes, two.credit_bytes);
  }
  // Off and every octave round-trip exactly; out-of-range sizes clamp onto the bounds.
  for (uint64_t f : {uint64_t{0}, 16 * KiB, 64 * KiB, 1 * MiB, 8 * MiB, 256 * MiB}) {
    const Knobs k{1 * MiB, 4 * MiB, f};
    EXPECT_EQ(s.to_knobs(s.from_knobs(k)).small_tensor_bytes, f) << f;
  }
  EXPECT_DOUBLE_EQ(s.from_knobs(Knobs{1 * MiB, 4 * MiB, 1}).at(2), band) << "below the minimum: the minimum, not off";
  EXPECT_DOUBLE_EQ(s.from_knobs(Knobs{1 * MiB, 4 * MiB, 1ull << 40}).at(2), 1.0);
}

// The fusion axis has bounds of its own in the tuner's options (COMMSCHED_TUNER_MIN/MAX_SMALL_TENSOR), like the
// partition's: they narrow the sizes searched and keep the off band below the smallest.
TEST(SearchSpace, TheFusionBoundsAreConfigurableAndValidated) {
  SearchSpaceBounds b;
  EXPECT_TRUE(b.set("min_small_tensor", "64KiB"));
  EXPECT_TRUE(b.set("max_small_tensor", "1MiB"));
  SearchSpace s(b);
  ASSERT_EQ(s.dim(), 3);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.5, 0.5, 0.0}).small_tensor_bytes, 0u) << "off stays the bottom band";
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.5, 0.5, 1.0}).small_tensor_bytes, 1 * MiB);
  const double band = 1.0 / (std::log2(double(MiB) / double(64 * KiB)) + 1.0);  // 4 octaves + the off band
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.5, 0.5, band}).small_tensor_bytes, 64 * KiB);
  for (int i = 0; i <= 50; ++i) {
    const uint64_t f = s.to_knobs(std::vector<double>{0.5, 0.5, i / 50.0}).small_tensor_bytes;
    EXPECT_TRUE(f == 0 || (f >= 64 * KiB && f <= 1 * MiB)) << f;
  }
  EXPECT_EQ(s.to_knobs(s.from_knobs(Knobs{1 * MiB, 4 * MiB, 8 * MiB})).small_tensor_bytes, 1 * MiB) << "clamped";

  // Through the tuner's options, as COMMSCHED_TUNER_* set them.
  TunerOptions o;
  o.set("max_small_tensor", "2MiB");
  EXPECT_EQ(o.space["small_tensor_bytes"].max, 2 * MiB);
  EXPECT_EQ(SearchSpaceBounds{}["small_tensor_bytes"].max, registered_tuning("small_tensor_bytes").max)
      << "defaults: the registered row";

  b["small_tensor_bytes"].max = 32 * KiB;  // below the minimum
  try {
    SearchSpace bad(b);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_TUNER_MAX_SMALL_TENSOR"), std::string::npos) << e.what();
  }
  b["small_tensor_bytes"].max = 1 * MiB;
  b["small_tensor_bytes"].min = 1024;  // below the alignment: 0 is the off band's job
  try {
    SearchSpace bad(b);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_TUNER_MIN_SMALL_TENSOR"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b.set("min_small_tensor", "lots"), InvalidArgument);
}

// A knob registered as tunable is searched without a change to the tuner: it gets an axis, with its own
// bounds, scale and alignment, beside partition and credit, whose behaviour stays as it was.
TEST(SearchSpace, AThirdRegisteredTunableKnobIsSearchedWithinItsBounds) {
  const KnobSpec knobs[] = {
      kKnobs[0],
      kKnobs[1],
      {.name = "fusion_threshold_bytes", .doc = "a knob the search space has never heard of",
       .tuning = {KnobScale::log_bytes, 8.0 * KiB, 2.0 * MiB, 1024, {}, false}},
      {.name = "window_bytes", .doc = "a multiple of the third knob, without an unlimited band",
       .tuning = {KnobScale::log_multiple, 2.0, 8.0, 1, "fusion_threshold_bytes", false}},
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
  SearchSpace plain = two_knobs();
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
  const KnobSpec reversed[] = {{.name = "backwards", .tuning = {KnobScale::log_bytes, 4096, 1024, 1, {}, false}}};
  try {
    SearchSpace s({}, reversed);
    FAIL() << "bounds out of order were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'backwards'"), std::string::npos) << e.what();
  }
  const KnobSpec orphan[] = {{.name = "orphan", .tuning = {KnobScale::log_multiple, 1, 4, 1, "missing", false}}};
  try {
    SearchSpace s({}, orphan);
    FAIL() << "a multiple of an unknown knob was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }
}

// The registry's rules (options/knobs.h check_knob_registry, a compile-time check of kKnobs; every rule in
// tests/unit/options): a tunable knob the tuner could not apply is a registration error naming it.
TEST(KnobRegistry, ATunableKnobWithoutAKnobsFieldIsRefused) {
  EXPECT_TRUE(check_knob_registry(kKnobs));
  KnobSpec ghost = kKnobs[2];
  ghost.name = "ghost_bytes";
  ghost.alias = "ghost";
  ghost.field = nullptr;
  const KnobSpec unapplied[] = {kKnobs[0], ghost};
  try {
    check_knob_registry(unapplied);
    FAIL() << "a tunable knob without a Knobs field was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'ghost_bytes'"), std::string::npos) << e.what();
  }
}

TEST(TunerOptions, ParsesOptionsAndNamesBadOnes) {
  TunerOptions o;
  o.set("trials", "8");
  o.set("warmup", "1");
  o.set("min_partition", "128KiB");
  o.set("csv", "/tmp/x.csv");
  EXPECT_EQ(o.max_trials, 8);
  EXPECT_EQ(o.warmup_iterations, 1);
  EXPECT_EQ(o.space["partition_bytes"].min, 128 * KiB);
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
