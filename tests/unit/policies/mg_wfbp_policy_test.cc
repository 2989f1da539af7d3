#include "scheduler/mg_wfbp_policy.h"

#include <gtest/gtest.h>

#include "tests/unit/policies/policy_test_util.h"

namespace commsched {
namespace {

using testing::arrive;
using testing::poll_at;

constexpr double kBeta = 1e-9;  // 1 ns per byte (1 GB/s)

// One iteration of a 4-layer backward: layer 3 ready at t0, layer 2 at t0+100us, ... 1 MB each.
std::vector<Batch> run_iteration(MergedGradientPolicy& p, uint64_t first_id, Nanos t0) {
  std::vector<Batch> sent;
  for (int i = 0; i < 4; ++i) {
    auto out = arrive(p, first_id + i, 3 - i, 1'000'000, t0 + i * 100'000);
    sent.insert(sent.end(), out.begin(), out.end());
  }
  p.on_backward_done(t0 + 400'000);
  auto rest = poll_at(p, t0 + 400'000);
  sent.insert(sent.end(), rest.begin(), rest.end());
  for (const Batch& b : sent) p.on_batch_done(b, t0 + 500'000);
  return sent;
}

TEST(MergedGradientPolicy, RejectsNegativeOrNonFiniteCosts) {
  EXPECT_THROW(MergedGradientPolicy(-1, kBeta), InvalidArgument);
  EXPECT_THROW(MergedGradientPolicy(0, -1), InvalidArgument);
  EXPECT_THROW(MergedGradientPolicy(1.0 / 0.0, kBeta), InvalidArgument);
}

TEST(MergedGradientPolicy, BehavesAsWfbpWhileLearning) {
  MergedGradientPolicy p(1.0, kBeta);  // a huge alpha, but nothing learned yet
  EXPECT_FALSE(p.learned());
  auto out = arrive(p, 1, 3, 1000, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].size(), 1u);
  EXPECT_EQ(p.bytes_in_flight(), 1000u);
}

TEST(MergedGradientPolicy, MergesEverythingWhenAlphaDominates) {
  MergedGradientPolicy p(10e-3, kBeta);  // 10 ms per message vs 100 us between gradients
  EXPECT_EQ(run_iteration(p, 1, 0).size(), 4u);
  ASSERT_TRUE(p.learned());
  ASSERT_EQ(p.merge_groups().size(), 1u);
  EXPECT_EQ(p.merge_groups()[0], (std::vector<int32_t>{3, 2, 1, 0}));
  auto sent = run_iteration(p, 10, 1'000'000);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].size(), 4u);
}

TEST(MergedGradientPolicy, NeverMergesWhenAlphaIsZero) {
  MergedGradientPolicy p(0.0, kBeta);
  run_iteration(p, 1, 0);
  EXPECT_EQ(p.merge_groups().size(), 4u);
  auto sent = run_iteration(p, 10, 1'000'000);
  EXPECT_EQ(sent.size(), 4u);
  for (const Batch& b : sent) EXPECT_EQ(b.size(), 1u);
}

TEST(MergedGradientPolicy, MergesOnlyWhereTheLinkIsBacklogged) {
  // 1 MB takes 1 ms at 1 GB/s, gradients come every 100 us: the link is backlogged from the first message on, so with a
  // small alpha the later ones merge; the first one goes alone (nothing to wait for).
  MergedGradientPolicy p(20e-6, kBeta);
  run_iteration(p, 1, 0);
  const auto groups = p.merge_groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<int32_t>{3}));
  EXPECT_EQ(groups[1], (std::vector<int32_t>{2, 1, 0}));
}

TEST(MergedGradientPolicy, IsDeterministic) {
  MergedGradientPolicy a(20e-6, kBeta), b(20e-6, kBeta);
  run_iteration(a, 1, 0);
  run_iteration(b, 1, 0);
  EXPECT_EQ(a.merge_groups(), b.merge_groups());
}

TEST(MergedGradientPolicy, SendsIncompleteGroupsAtBackwardDone) {
  MergedGradientPolicy p(10e-3, kBeta);
  run_iteration(p, 1, 0);
  arrive(p, 20, 3, 1'000'000, 2'000'000);
  EXPECT_EQ(p.queued_partitions(), 1u);
  p.on_backward_done(2'100'000);
  auto out = poll_at(p, 2'100'000);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(p.queued_partitions(), 0u);
}

// Tasks outside a backward (a parameter broadcast before training) must not become the learning iteration: they all
// arrive at once, so a plan learned from them would merge every gradient into one message, like BSP.
TEST(MergedGradientPolicy, DoesNotLearnFromTasksFlushedOutsideABackward) {
  MergedGradientPolicy p(20e-6, kBeta);
  for (int prio = 0; prio < 4; ++prio) EXPECT_EQ(arrive(p, 100 + prio, prio, 1'000'000, 0).size(), 1u);  // at once
  p.on_flush(10);
  EXPECT_FALSE(p.learned());
  EXPECT_EQ(p.queued_partitions(), 0u);
  run_iteration(p, 1, 1'000'000);  // the real backward
  ASSERT_TRUE(p.learned());
  EXPECT_EQ(p.merge_groups(), (std::vector<std::vector<int32_t>>{{3}, {2, 1, 0}}));  // as learned without the flush
}

TEST(MergedGradientPolicy, FlushSendsIncompleteGroupsAfterLearning) {
  MergedGradientPolicy p(10e-3, kBeta);
  run_iteration(p, 1, 0);  // one group of all four
  EXPECT_TRUE(arrive(p, 20, 2, 1000, 2'000'000).empty());  // an eager call on a planned priority waits for its group
  p.on_flush(2'000'010);
  auto out = poll_at(p, 2'000'010);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0][0].task_id, 20u);
  EXPECT_EQ(p.merge_groups().size(), 1u);  // the plan stands
}

}  // namespace
}  // namespace commsched
