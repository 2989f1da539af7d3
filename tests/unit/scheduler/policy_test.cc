#include <gtest/gtest.h>

#include "scheduler/fifo_policy.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

// Tells a policy about a task split into `parts` partitions of `bytes` each.
void arrive(Policy& p, uint64_t id, int32_t prio, int parts, uint64_t bytes) {
  std::vector<PartRef> refs;
  for (int i = 0; i < parts; ++i)
    refs.push_back(PartRef{id, static_cast<uint32_t>(i), prio, id, static_cast<uint64_t>(i) * bytes, bytes});
  p.on_task_arrived(TaskArrival{id, prio, id, bytes * parts, refs}, 0);
}

TEST(PriorityCreditPolicy, MostUrgentFirstWithinCredit) {
  PriorityCreditPolicy p(/*credit=*/200, 0, /*stall_guard=*/false);
  arrive(p, 0, /*prio=*/5, 4, 100);
  arrive(p, 1, /*prio=*/1, 2, 100);
  std::vector<Batch> out;
  p.poll(0, out);
  ASSERT_EQ(out.size(), 2u) << "credit 200 admits two 100-byte partitions";
  EXPECT_EQ(out[0][0].task_id, 1u);
  EXPECT_EQ(out[1][0].task_id, 1u);
  EXPECT_EQ(p.bytes_in_flight(), 200u);
  std::vector<Batch> more;
  p.poll(0, more);
  EXPECT_TRUE(more.empty()) << "credit exhausted";
  p.on_batch_done(out[0], 1);
  p.poll(1, more);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0][0].task_id, 0u);
  EXPECT_EQ(more[0][0].index, 0u) << "ties broken by offset";
}

TEST(PriorityCreditPolicy, OversizedPartitionGoesWhenIdle) {
  PriorityCreditPolicy p(/*credit=*/10, 0, false);
  arrive(p, 0, 0, 2, 100);
  std::vector<Batch> out;
  p.poll(0, out);
  ASSERT_EQ(out.size(), 1u) << "nothing in flight: the next partition always goes";
  p.poll(0, out);
  EXPECT_EQ(out.size(), 1u) << "but not a second one over the credit";
}

TEST(PriorityCreditPolicy, UnlimitedCreditSendsEverything) {
  PriorityCreditPolicy p(/*credit=*/0);
  arrive(p, 0, 3, 10, 1000);
  std::vector<Batch> out;
  p.poll(0, out);
  EXPECT_EQ(out.size(), 10u);
}

TEST(PriorityCreditPolicy, TiesBrokenByArrival) {
  PriorityCreditPolicy p(0);
  arrive(p, 7, 2, 1, 10);
  arrive(p, 3, 2, 1, 10);  // same priority, arrives later but has the smaller id/seq
  std::vector<Batch> out;
  p.poll(0, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0][0].task_id, 3u) << "seq decides among equal priorities";
}

TEST(PriorityCreditPolicy, FusesQueuedSmallTensorsOnly) {
  PriorityCreditPolicy p(/*credit=*/100, /*small=*/64, false);
  arrive(p, 0, 0, 1, 100);  // fills the credit
  std::vector<Batch> out;
  p.poll(0, out);
  ASSERT_EQ(out.size(), 1u);
  for (uint64_t id = 1; id <= 6; ++id) arrive(p, id, static_cast<int32_t>(id), 1, 16);
  arrive(p, 7, 9, 1, 1000);  // big: never fused
  std::vector<Batch> next;
  p.poll(0, next);
  EXPECT_TRUE(next.empty());
  p.on_batch_done(out[0], 1);
  p.poll(1, next);
  ASSERT_GE(next.size(), 1u);
  EXPECT_EQ(next[0].size(), 4u) << "four 16-byte tensors fill the 64-byte fusion size";
  for (size_t i = 0; i < next[0].size(); ++i) EXPECT_EQ(next[0][i].task_id, i + 1) << "in priority order";
}

// The fusion bound is a knob: set_knobs() changes it live, and what is queued then is fused by the new bound.
TEST(PriorityCreditPolicy, SetKnobsChangesTheFusionBoundLive) {
  PriorityCreditPolicy p(/*credit=*/100, /*small=*/0, false);
  auto drain_one_round = [&](uint64_t first_id, Nanos now) {
    arrive(p, first_id, 0, 1, 100);  // fills the credit
    std::vector<Batch> out;
    p.poll(now, out);
    EXPECT_EQ(out.size(), 1u);
    for (uint64_t id = first_id + 1; id <= first_id + 4; ++id) arrive(p, id, static_cast<int32_t>(id), 1, 16);
    p.on_batch_done(out[0], now + 1);
    std::vector<Batch> next;
    p.poll(now + 1, next);
    for (const Batch& b : next) p.on_batch_done(b, now + 2);
    return next;
  };
  const std::vector<Batch> before = drain_one_round(0, 0);
  ASSERT_EQ(before.size(), 4u) << "fusion off: the small tensors go one by one";
  EXPECT_EQ(before[0].size(), 1u);
  Knobs k;
  k.credit_bytes = 100;
  k.small_tensor_bytes = 64;
  p.set_knobs(k);
  EXPECT_EQ(p.small_tensor_bytes(), 64u);
  EXPECT_EQ(p.credit_bytes(), 100u);
  const std::vector<Batch> after = drain_one_round(10, 10);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].size(), 4u) << "fused up to the new 64-byte bound";
  k.small_tensor_bytes = 0;
  p.set_knobs(k);
  const std::vector<Batch> off_again = drain_one_round(20, 20);
  ASSERT_EQ(off_again.size(), 4u) << "0 turns fusion off again";
}

TEST(PriorityCreditPolicy, StallGuardOverdraftsWhenNothingCompletes) {
  PriorityCreditPolicy p(/*credit=*/100);
  arrive(p, 0, 0, 3, 100);
  std::vector<Batch> out;
  p.poll(0, out);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(p.next_wakeup().has_value()) << "partitions wait behind a full credit: the policy wants a wake-up";
  const Nanos stall = *p.next_wakeup();
  p.poll(stall - 1, out);
  EXPECT_EQ(out.size(), 1u) << "not stalled yet";
  p.poll(stall, out);
  EXPECT_EQ(out.size(), 2u) << "stalled: one partition goes over the credit";
  EXPECT_EQ(p.overdrafts(), 1u);
  p.poll(stall, out);
  EXPECT_EQ(out.size(), 2u) << "one per stall time";
  p.on_batch_done(out[0], stall + 10);
  p.on_batch_done(out[1], stall + 20);
  p.poll(stall + 20, out);
  EXPECT_EQ(out.size(), 3u) << "completions flow again: normal credit rules";
}

TEST(PriorityCreditPolicy, NoWakeupWithoutStallGuard) {
  PriorityCreditPolicy p(100, 0, /*stall_guard=*/false);
  arrive(p, 0, 0, 3, 100);
  std::vector<Batch> out;
  p.poll(0, out);
  EXPECT_FALSE(p.next_wakeup().has_value());
  p.poll(1'000'000'000, out);
  EXPECT_EQ(out.size(), 1u);
}

TEST(FifoPolicy, WholeTensorsInArrivalOrderNoCredit) {
  FifoPolicy p;
  EXPECT_FALSE(p.splits_tasks());
  arrive(p, 0, 9, 1, 1 << 20);
  arrive(p, 1, 0, 1, 10);
  std::vector<Batch> out;
  p.poll(0, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0][0].task_id, 0u) << "arrival order, not priority";
  EXPECT_EQ(p.bytes_in_flight(), (1u << 20) + 10u);
}

}  // namespace
}  // namespace commsched
