#include "scheduler/fusion_policy.h"

#include <gtest/gtest.h>

#include "tests/unit/policies/policy_test_util.h"

namespace commsched {
namespace {

using testing::arrive;
using testing::batch_bytes;
using testing::poll_at;

constexpr Nanos kCycle = 5'000'000;  // 5 ms

TEST(FusionPolicy, RejectsNegativeCycle) { EXPECT_THROW(FusionPolicy(1000, -1), InvalidArgument); }

TEST(FusionPolicy, FusesReadyTensorsUpToTheThreshold) {
  FusionPolicy p(1000, kCycle);
  EXPECT_FALSE(p.splits_tasks());
  // First tick takes the first tensor at once; the rest queue behind it until it completes.
  auto first = arrive(p, 1, 9, 400, 0);
  ASSERT_EQ(first.size(), 1u);
  const uint64_t sizes[] = {400, 400, 300, 1500, 200};
  for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(arrive(p, 2 + i, 8 - int32_t(i), sizes[i], 1000 + i).empty());
  p.on_batch_done(first[0], 2'000'000);
  // Next tick: one cycle after the first. Nothing moves before it.
  EXPECT_TRUE(poll_at(p, 2'000'000).empty());
  ASSERT_TRUE(p.next_wakeup().has_value());
  EXPECT_EQ(*p.next_wakeup(), kCycle);
  EXPECT_TRUE(poll_at(p, kCycle - 1).empty());

  // Readiness order, greedy up to 1000 bytes: [400, 400] [300] [1500 alone] [200]; one batch in flight at a time.
  std::vector<uint64_t> got;
  Nanos now = kCycle;
  for (int round = 0; round < 4; ++round) {
    auto out = poll_at(p, now);
    ASSERT_EQ(out.size(), 1u) << "round " << round;
    EXPECT_TRUE(batch_bytes(out[0]) <= 1000 || out[0].size() == 1);
    got.push_back(batch_bytes(out[0]));
    EXPECT_TRUE(poll_at(p, now).empty()) << "a second batch while one is in flight";
    now += 100;
    p.on_batch_done(out[0], now);
  }
  EXPECT_EQ(got, (std::vector<uint64_t>{800, 300, 1500, 200}));
  EXPECT_EQ(p.queued_partitions(), 0u);
  EXPECT_EQ(p.bytes_in_flight(), 0u);
}

TEST(FusionPolicy, IdleLoopWakesOnTheCycleGrid) {
  FusionPolicy p(1 << 20, kCycle);
  auto out = arrive(p, 1, 0, 100, 0);
  ASSERT_EQ(out.size(), 1u);
  p.on_batch_done(out[0], 1000);
  // Arrives long after: the loop, idle, woke at 5, 10, 15 ms...; 12 ms waits for the 15 ms tick.
  EXPECT_TRUE(arrive(p, 2, 0, 100, 12'000'000).empty());
  ASSERT_TRUE(p.next_wakeup().has_value());
  EXPECT_EQ(*p.next_wakeup(), 15'000'000);
  EXPECT_EQ(poll_at(p, 15'000'000).size(), 1u);
}

// A real clock polls after the wake-up it asked for: the tick it was waiting for must still take the tensors
// (recomputing "the next tick after now" would push it a cycle ahead forever).
TEST(FusionPolicy, ALatePollStillTakesTheScheduledTick) {
  FusionPolicy p(1 << 20, kCycle);
  auto out = arrive(p, 1, 0, 100, 0);
  p.on_batch_done(out[0], 1000);
  EXPECT_TRUE(arrive(p, 2, 0, 100, 12'000'000).empty());
  ASSERT_EQ(*p.next_wakeup(), 15'000'000);
  EXPECT_EQ(poll_at(p, 15'000'037).size(), 1u);
}

TEST(FusionPolicy, BusyLoopRunsAgainAsSoonAsItsBatchesComplete) {
  FusionPolicy p(1 << 20, kCycle);
  auto out = arrive(p, 1, 0, 100, 0);
  arrive(p, 2, 0, 100, 10);
  p.on_batch_done(out[0], 7'000'000);  // took longer than a cycle: no extra sleep
  EXPECT_EQ(poll_at(p, 7'000'000).size(), 1u);
}

TEST(FusionPolicy, ZeroThresholdSendsTensorsAlone) {
  FusionPolicy p(0, 0);
  auto out = arrive(p, 1, 0, 100, 0);
  arrive(p, 2, 1, 100, 0);
  arrive(p, 3, 2, 100, 0);
  ASSERT_EQ(out.size(), 1u);
  p.on_batch_done(out[0], 5);
  for (int i = 0; i < 2; ++i) {
    auto next = poll_at(p, 5 + i);
    ASSERT_EQ(next.size(), 1u);
    EXPECT_EQ(next[0].size(), 1u);
    p.on_batch_done(next[0], 5 + i);
  }
}

}  // namespace
}  // namespace commsched
