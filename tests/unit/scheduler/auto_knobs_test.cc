#include "scheduler/auto_knobs.h"

#include <gtest/gtest.h>

namespace commsched {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

TEST(AutoKnobs, PartitionShrinksWithWorkersAndCreditCoversOnePartitionFromEach) {
  struct Case {
    int workers;
    uint64_t partition;
  };
  for (const Case& c : {Case{2, 256 * KiB}, Case{3, 256 * KiB}, Case{16, 256 * KiB}, Case{31, 256 * KiB},
                        Case{32, 128 * KiB}, Case{64, 64 * KiB}, Case{1024, 64 * KiB}}) {
    const Knobs k = auto_knobs({c.workers, c.workers});
    EXPECT_EQ(k.partition_bytes, c.partition) << c.workers << " workers";
    EXPECT_EQ(k.credit_bytes, c.partition * uint64_t(c.workers + 1)) << c.workers << " workers";
  }
}

TEST(AutoKnobs, WithoutServersOrWithOneWorkerTheDefaultsStay) {
  EXPECT_EQ(auto_knobs({8, 0}).partition_bytes, Knobs{}.partition_bytes);
  EXPECT_EQ(auto_knobs({8, 0}).credit_bytes, Knobs{}.credit_bytes);
  EXPECT_EQ(auto_knobs({1, 1}).credit_bytes, Knobs{}.credit_bytes);
}

TEST(AutoKnobs, ExplicitKnobsAreKeptAndAnExplicitPartitionGetsItsCredit) {
  EngineConfig both;
  both.set("partition_bytes", "1KiB");
  both.set("credit_bytes", "4KiB");
  EXPECT_TRUE(apply_auto_knobs(both, {16, 16}).empty());
  EXPECT_EQ(both.knobs.partition_bytes, 1 * KiB);
  EXPECT_EQ(both.knobs.credit_bytes, 4 * KiB);

  EngineConfig part;
  part.set("partition_bytes", "1MiB");
  const std::string why = apply_auto_knobs(part, {16, 16});
  EXPECT_EQ(part.knobs.partition_bytes, 1 * MiB);
  EXPECT_EQ(part.knobs.credit_bytes, 17 * MiB);
  EXPECT_NE(why.find("partition 1 MiB (set)"), std::string::npos) << why;
  EXPECT_NE(why.find("credit 17 MiB (automatic"), std::string::npos) << why;

  EngineConfig none;
  apply_auto_knobs(none, {16, 4});
  EXPECT_EQ(none.knobs.partition_bytes, 256 * KiB);
  EXPECT_EQ(none.knobs.credit_bytes, 17 * 256 * KiB);
}

}  // namespace
}  // namespace commsched
