#include "scheduler/bsp_policy.h"

#include <gtest/gtest.h>

#include "tests/unit/policies/policy_test_util.h"

namespace commsched {
namespace {

using testing::arrive;
using testing::poll_at;

TEST(BspPolicy, SendsNothingBeforeBackwardDone) {
  BspPolicy p;
  EXPECT_FALSE(p.splits_tasks());
  // Backward order: the last layer (priority 3) first.
  for (int prio = 3; prio >= 0; --prio) EXPECT_TRUE(arrive(p, 10 + (3 - prio), prio, 1000, prio * 100).empty());
  EXPECT_TRUE(poll_at(p, 10'000).empty());
  EXPECT_EQ(p.queued_partitions(), 4u);
  EXPECT_EQ(p.bytes_in_flight(), 0u);
}

TEST(BspPolicy, ReleasesEverythingInPriorityOrderWithoutCredit) {
  BspPolicy p;
  for (int prio = 3; prio >= 0; --prio) arrive(p, 10 + (3 - prio), prio, 1000 * (prio + 1), 0);
  p.on_backward_done(500);
  auto out = poll_at(p, 500);
  ASSERT_EQ(out.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(out[i].size(), 1u) << "BSP never fuses";
    EXPECT_EQ(out[i][0].priority, i);
  }
  EXPECT_EQ(p.bytes_in_flight(), 10'000u);
  EXPECT_EQ(p.queued_partitions(), 0u);
  for (const Batch& b : out) p.on_batch_done(b, 900);
  EXPECT_EQ(p.bytes_in_flight(), 0u);
}

TEST(BspPolicy, FlushReleasesWhatIsHeld) {
  BspPolicy p;
  EXPECT_TRUE(arrive(p, 1, 5, 1000, 0).empty());
  p.on_flush(10);
  auto out = poll_at(p, 10);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0][0].task_id, 1u);
}

TEST(BspPolicy, TasksOfTheNextIterationWaitForTheNextBoundary) {
  BspPolicy p;
  arrive(p, 1, 0, 100, 0);
  p.on_backward_done(10);
  EXPECT_EQ(poll_at(p, 10).size(), 1u);
  EXPECT_TRUE(arrive(p, 2, 0, 100, 20).empty());
  p.on_backward_done(30);
  auto out = poll_at(p, 30);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0][0].task_id, 2u);
}

}  // namespace
}  // namespace commsched
