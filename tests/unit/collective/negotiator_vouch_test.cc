// Rank 0 vouching (NegotiatorOptions::vouch, GlobalOrder "Vouching"): a partition every rank ran before is ordered on
// rank 0's readiness alone, and the other ranks run that order as their own submissions come.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "comm_backends/collective/negotiator.h"
#include "tests/unit/collective/negotiator_fixture.h"

namespace commsched::collective {
namespace {

using namespace test;
using namespace std::chrono_literals;

// Round 0 of keys 1..n on every rank: after it every rank knows them by cache id.
void run_round_zero(Group& g, int size, uint64_t n) {
  for (int r = 0; r < size; ++r) {
    std::vector<Submission> subs;
    for (uint64_t k = 1; k <= n; ++k) subs.push_back(sub(k, 400, static_cast<int32_t>(k)));
    g.rank(r).submit(std::move(subs));
  }
  for (int r = 0; r < size; ++r) ASSERT_TRUE(g.log(r).wait_settled(n, 10s)) << "rank " << r;
}

// Rank 0 runs round 1 before rank 1 has submitted any of it; rank 1 then submits in the reverse order and runs the
// groups in rank 0's order, each once its partition has come.
TEST(NegotiatorVouch, RankZeroOrdersWhatEveryRankRanBeforeAndTheOthersRunItAsTheirsComes) {
  Group g(2);
  run_round_zero(g, 2, 3);
  std::vector<Submission> mine;
  for (uint64_t k = 1; k <= 3; ++k) mine.push_back(sub(k, 400, static_cast<int32_t>(k), 1));
  g.rank(0).submit(mine);
  ASSERT_TRUE(g.log(0).wait_settled(6, 10s)) << "rank 0 waited for rank 1's reports";
  std::this_thread::sleep_for(50ms);  // the order reaches rank 1, which has nothing of round 1 yet
  {
    std::lock_guard lock(g.log(1).mu);
    EXPECT_EQ(g.log(1).settled, 3u) << "rank 1 ran a group before submitting its partitions";
  }
  for (int k = 3; k >= 1; --k) {
    g.rank(1).submit({sub(static_cast<uint64_t>(k), 400, k, 1)});
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(g.log(1).wait_settled(6, 10s));
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(g.log(r).failures.empty()) << g.log(r).failures[0].second.message;
  EXPECT_EQ(g.log(1).groups, g.log(0).groups) << "rank 1 ran a different order";
}

// Rank 1's tensor changed size after round 0: rank 0 ordered the old size, so the group fails on every rank naming the
// task and both sizes; nothing is left pending. Rank 0 submits first, so it has vouched (submit() orders on its
// caller) before rank 1's report can reach it; rank 1 finds the difference when its submission meets the order
// (fill_awaited_locked) or when the order meets its submission (ordered_token_locked), whichever comes first. (Had
// rank 1's report reached rank 0 first, rank 0 would not vouch, and the ordinary mismatch would fail the tensor only,
// as Negotiator.MismatchedSizesFailOnBothRanksNamingTheKey checks.)
TEST(NegotiatorVouch, ASubmissionThatDiffersFromWhatRankZeroOrderedFailsEveryRankNamingIt) {
  for (const bool order_first : {true, false}) {
    SCOPED_TRACE(order_first ? "rank 1 submits after the order came" : "rank 1 submits at once");
    Group g(2);
    run_round_zero(g, 2, 1);
    g.rank(0).submit({sub(1, 400, 1, 1)});
    if (order_first) std::this_thread::sleep_for(50ms);
    g.rank(1).submit({sub(1, 800, 1, 1)});
    ASSERT_TRUE(g.log(1).wait_settled(2, 10s)) << "rank 1's differing submission was left pending";
    std::string message;
    {
      std::lock_guard lock(g.log(1).mu);
      ASSERT_EQ(g.log(1).failures.size(), 1u);
      message = g.log(1).failures[0].second.message;
    }
    EXPECT_NE(message.find("task 't1'"), std::string::npos) << message;
    EXPECT_NE(message.find("differs across ranks"), std::string::npos) << message;
    EXPECT_NE(message.find("400"), std::string::npos) << message;
    EXPECT_NE(message.find("800"), std::string::npos) << message;
    // Rank 0 ran its copy (the test's collectives do not wait for each other); its next submission fails.
    g.rank(0).submit({sub(2, 400, 1, 0)});
    ASSERT_TRUE(g.log(0).wait_settled(3, 10s));
    std::lock_guard lock(g.log(0).mu);
    ASSERT_EQ(g.log(0).failures.size(), 1u);
    EXPECT_NE(g.log(0).failures[0].second.message.find("differs across ranks"), std::string::npos)
        << g.log(0).failures[0].second.message;
  }
}

// A rank that joins (Horovod's join) while rank 0 has ordered ahead what it will never submit runs zeros for it.
TEST(NegotiatorVouch, ARankThatJoinsStandsInForWhatRankZeroOrderedAhead) {
  Group g(2);
  run_round_zero(g, 2, 1);
  g.rank(0).submit({sub(1, 400, 1, 1)});
  ASSERT_TRUE(g.log(0).wait_settled(2, 10s));
  std::this_thread::sleep_for(50ms);  // rank 1 holds the order, waiting for its submission
  auto joined = std::async(std::launch::async, [&] { return g.rank(1).join(); });
  std::this_thread::sleep_for(50ms);
  const int last = g.rank(0).join();
  EXPECT_EQ(joined.get(), last);
  std::lock_guard lock(g.log(1).mu);
  EXPECT_TRUE(g.log(1).failures.empty()) << g.log(1).failures[0].second.message;
  ASSERT_EQ(g.log(1).groups.size(), 2u) << "rank 1 did not stand in for the group rank 0 ordered ahead";
  EXPECT_GE(g.log(1).groups[1].at(0), 1u << 30) << "rank 1 ran something other than a stand-in";
}

// Round 1 of partition 1: rank 0 vouches for it and ranks 0 and 2 run it; rank 1 shuts down instead of submitting
// it. Returns rank 1's shutdown, which ends once every rank is leaving (everyone_leaves).
std::future<void> rank_one_leaves_round_one(Group& g) {
  run_round_zero(g, 3, 1);
  for (int r : {0, 2}) g.rank(r).submit({sub(1, 400, 1, 1)});
  for (int r : {0, 2}) EXPECT_TRUE(g.log(r).wait_settled(2, 10s)) << "rank " << r << " did not run rank 0's order";
  return std::async(std::launch::async, [&g] { g.rank(1).shutdown(); });
}

void everyone_leaves(Group& g, std::future<void>& gone) {
  std::thread zero([&] { g.rank(0).shutdown(); });  // the goodbye barrier lets rank 1 go once every rank is leaving
  g.rank(2).shutdown();
  zero.join();
  gone.get();
}

// Rank 0 vouched for a partition and ran it; rank 1 shuts down instead of submitting it. The collective cannot finish
// (on Gloo it fails on the closed connection): rank 0 tells every rank why, naming rank 1, and a rank whose
// collective of it failed reads that (ordered_failure) rather than the transport's error.
TEST(NegotiatorVouch, ARankThatShutsDownBeforeWhatRankZeroOrderedIsNamedAsTheReason) {
  Group g(3);
  auto gone = rank_one_leaves_round_one(g);
  for (int r : {0, 2}) {
    std::string why;
    for (auto end = std::chrono::steady_clock::now() + 10s; why.empty() && std::chrono::steady_clock::now() < end;) {
      why = g.rank(r).ordered_failure(1, 0, 1);
      if (why.empty()) std::this_thread::sleep_for(5ms);
    }
    EXPECT_NE(why.find("'t1'"), std::string::npos) << "rank " << r << ": " << why;
    EXPECT_NE(why.find("rank 1 shut down before it ran"), std::string::npos) << "rank " << r << ": " << why;
    EXPECT_EQ(g.rank(r).ordered_failure(1, 0, 1), "") << "told twice";
  }
  EXPECT_EQ(g.rank(0).ordered_failure(1, 0, 0), "") << "round 0 ran on every rank";
  everyone_leaves(g, gone);
}

// Rank 0's reason is kept only while the collective it would explain is not over: once the partition's collective
// has run or failed on a rank (the backend says so with ran()), the reason is dropped there instead of staying for
// the rest of the run; a collective of an earlier round drops nothing.
// What the backend tells the negotiator once partition (key, offset) of `round` ran as a collective of its own.
void ran(Negotiator& n, uint64_t key, uint64_t offset, uint64_t round) {
  TaskDesc task;
  task.key = key;
  task.round = round;
  PartitionView view;
  view.task = &task;
  view.offset = offset;
  n.ran(std::span<const PartitionView>(&view, 1));
}

TEST(NegotiatorVouch, ARankZeroReasonIsDroppedWhenItsPartitionsCollectiveIsOver) {
  Group g(3);
  auto gone = rank_one_leaves_round_one(g);
  for (int r : {0, 2}) {
    for (auto end = std::chrono::steady_clock::now() + 10s;
         g.rank(r).stats().reasons_kept == 0 && std::chrono::steady_clock::now() < end;)
      std::this_thread::sleep_for(5ms);
    ASSERT_EQ(g.rank(r).stats().reasons_kept, 1u) << "rank " << r << " was not told why round 1 cannot finish";
    ran(g.rank(r), 1, 0, 0);
    EXPECT_EQ(g.rank(r).stats().reasons_kept, 1u) << "rank " << r << ": round 0's end dropped round 1's reason";
    ran(g.rank(r), 1, 0, 1);
    EXPECT_EQ(g.rank(r).stats().reasons_kept, 0u) << "rank " << r << " kept the reason after the collective was over";
    EXPECT_EQ(g.rank(r).ordered_failure(1, 0, 1), "") << "rank " << r;
  }
  everyone_leaves(g, gone);
}

}  // namespace
}  // namespace commsched::collective
