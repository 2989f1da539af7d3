#include <gtest/gtest.h>

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
  EXPECT_EQ(lo.credit_bytes, 64 * KiB);  // one partition
  const Knobs hi = s.to_knobs(std::vector<double>{1.0, 1.0});
  EXPECT_EQ(hi.partition_bytes, 64 * MiB);
  EXPECT_EQ(hi.credit_bytes, 0u);  // unlimited
  // The largest finite multiple sits exactly at the edge of the unlimited band: 6 of 7 octaves.
  const Knobs edge = s.to_knobs(std::vector<double>{0.0, 6.0 / 7.0});
  EXPECT_EQ(edge.credit_bytes, 64 * 64 * KiB);
  EXPECT_EQ(s.to_knobs(std::vector<double>{0.0, 6.5 / 7.0}).credit_bytes, 0u);
}

TEST(SearchSpace, KnobsRoundTripThroughTheUnitSquare) {
  SearchSpace s;
  for (uint64_t p = 64 * KiB; p <= 64 * MiB; p *= 2) {
    for (uint64_t m : {1ull, 2ull, 3ull, 8ull, 64ull, 0ull}) {
      const Knobs k{p, m * p};
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
    for (double b = 0.0; b <= 6.0 / 7.0; b += 0.1) {
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
    const uint64_t p = s.partition_bytes(i / 100.0);
    EXPECT_EQ(p % 4096, 0u);
    EXPECT_GE(p, prev);
    prev = p;
  }
}

TEST(SearchSpace, OutOfRangeKnobsAreClamped) {
  SearchSpace s;
  const auto u = s.from_knobs(Knobs{1 * KiB, 1024 * MiB});
  EXPECT_DOUBLE_EQ(u[0], 0.0);
  EXPECT_NEAR(u[1], 6.0 / 7.0, 1e-12);  // a huge finite credit stays finite: the largest multiple
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
