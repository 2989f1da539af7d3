// A caller that waits for its groups does the negotiator's work itself (Negotiator::help_until, the WaitHelper a
// collective backend lends): it receives the order and runs the groups on its own thread, in the order every rank
// runs, never a group twice, and the negotiator thread carries on whenever the caller stops helping.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "comm_backends/collective/negotiator.h"
#include "tests/unit/collective/negotiator_fixture.h"

namespace commsched::collective {
namespace {

using namespace test;
using Clock = std::chrono::steady_clock;

std::function<bool()> settled_at_least(RankLog& log, size_t n) {
  return [&log, n] {
    std::lock_guard lock(log.mu);
    return log.settled >= n;
  };
}

std::function<bool()> ran(RankLog& log, uint64_t token) {
  return [&log, token] {
    std::lock_guard lock(log.mu);
    for (const auto& g : log.groups)
      if (std::find(g.begin(), g.end(), token) != g.end()) return true;
    return false;
  };
}

// Rank 1 waits for its group before rank 0 has submitted, so the order reaches rank 1 while its caller helps: the
// caller, not the negotiator thread, must run it (the thread leaves the peers' frames to a helping caller). Rank 0
// submits only once rank 1's caller is inside help_until (its done() has been asked), so no scheduler delay between
// rank 1's submit and its wait can hand the order to the thread. Rank 0's caller helps too, racing its own negotiator
// thread, which rank 0's submit wakes: that share depends on the scheduler and is not asserted.
TEST(NegotiatorHelp, ACallerThatWaitsRunsItsGroupsOnItsOwnThreadInTheAgreedOrder) {
  constexpr int kRounds = 40;
  Group g(2, 0, 5, /*execute_blocks=*/true);
  std::thread::id caller1;
  std::atomic<uint64_t> helping_in_round{0};  // round + 1 once rank 1's caller helps for that round
  std::thread rank1([&] {
    caller1 = std::this_thread::get_id();
    for (uint64_t round = 0; round < kRounds; ++round) {
      g.rank(1).submit({sub(1, 64, 0, round)});
      const auto settled = settled_at_least(g.log(1), round + 1);
      g.rank(1).help_until([&, round] { helping_in_round = round + 1; return settled(); }, 10s);
      ASSERT_TRUE(g.log(1).wait_settled(round + 1, 10s)) << "rank 1 round " << round;
    }
  });
  for (uint64_t round = 0; round < kRounds; ++round) {
    const auto until = Clock::now() + 10s;
    while (helping_in_round.load() <= round && Clock::now() < until) std::this_thread::yield();
    ASSERT_GT(helping_in_round.load(), round) << "rank 1's caller never helped in round " << round;
    g.rank(0).submit({sub(1, 64, 0, round)});
    g.rank(0).help_until(settled_at_least(g.log(0), round + 1), 10s);
    ASSERT_TRUE(g.log(0).wait_settled(round + 1, 10s)) << "rank 0 round " << round;
  }
  rank1.join();
  for (int r = 0; r < 2; ++r) {
    std::lock_guard lock(g.log(r).mu);
    EXPECT_TRUE(g.log(r).failures.empty()) << g.log(r).failures.front().second.message;
    EXPECT_EQ(g.log(r).groups.size(), static_cast<size_t>(kRounds));
  }
  const auto on_caller = std::count(g.log(1).runners.begin(), g.log(1).runners.end(), caller1);
  // Before the follower mode (the thread reading the peers beside a helping caller) the caller ran 1-2 of 40.
  EXPECT_EQ(on_caller, kRounds) << "rank 1's helping caller ran " << on_caller << " of " << kRounds;
  EXPECT_EQ(g.log(1).groups, g.log(0).groups);
}

// Several threads per rank submit and help at once, racing each other and the negotiator thread for the same orders:
// each group still runs exactly once per rank, and every rank runs them in the same order.
TEST(NegotiatorHelp, ConcurrentHelpersRunEveryGroupOnceInTheSameOrderOnEveryRank) {
  constexpr int kRanks = 3, kThreads = 3, kEach = 25;
  Group g(kRanks, 0, 5, /*execute_blocks=*/true);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, r, t] {
        for (uint64_t i = 0; i < kEach; ++i) {
          const uint64_t key = 1000 * (t + 1) + i;
          g.rank(r).submit({sub(key, 64, static_cast<int32_t>(i))});
          g.rank(r).help_until(ran(g.log(r), key), 200us);  // short: often gives up and leaves it to the thread
        }
      });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(g.log(r).wait_settled(kThreads * kEach, 20s)) << "rank " << r;
    std::lock_guard lock(g.log(r).mu);
    EXPECT_TRUE(g.log(r).failures.empty()) << g.log(r).failures.front().second.message;
    std::vector<uint64_t> tokens;
    for (const auto& grp : g.log(r).groups) tokens.insert(tokens.end(), grp.begin(), grp.end());
    std::sort(tokens.begin(), tokens.end());
    EXPECT_EQ(std::adjacent_find(tokens.begin(), tokens.end()), tokens.end()) << "rank " << r << " ran a token twice";
    EXPECT_EQ(tokens.size(), static_cast<size_t>(kThreads * kEach));
  }
  for (int r = 1; r < kRanks; ++r) {
    std::lock_guard lock(g.log(r).mu);
    EXPECT_EQ(g.log(r).groups, g.log(0).groups) << "rank " << r << " ran a different order";
  }
}

// Rank 0 under a credit of one partition: a group completed on a helping caller frees the credit even when the caller
// stops helping at once (it wakes the negotiator thread, which orders the next). Without that the next order waits for
// the thread's next heartbeat round (half a second here), ten times over.
TEST(NegotiatorHelp, ACompletionOnAHelperThatStopsStillFreesRankZerosCredit) {
  constexpr uint64_t kParts = 10;
  Group g(2, 0, /*timeout_s=*/60, /*execute_blocks=*/true);
  g.rank(0).order_inbox().post(knobs(100));  // one 64-byte partition in flight at a time
  std::vector<Submission> subs;
  for (uint64_t k = 1; k <= kParts; ++k) subs.push_back(sub(k, 64, static_cast<int32_t>(k)));
  const auto t0 = Clock::now();
  g.rank(1).submit(subs);
  g.rank(0).submit(subs);
  std::thread other([&] { g.rank(1).help_until(settled_at_least(g.log(1), kParts), 20s); });
  for (uint64_t n = 1; n <= kParts; ++n) g.rank(0).help_until(settled_at_least(g.log(0), n), 20s);
  other.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(kParts, 20s)) << "rank " << r;
  EXPECT_LT(Clock::now() - t0, 2500ms) << "completions told on a helper waited for the negotiator thread's heartbeat";
  EXPECT_EQ(g.log(1).groups, g.log(0).groups);
}

// A peer lost while a caller helps: the caller's wait ends with the loss (naming the lost rank), not a hang.
TEST(NegotiatorHelp, APeerLostWhileACallerHelpsFailsItsWorkNamingThePeer) {
  TwoRanksAndAFake g(/*timeout_s=*/5, /*execute_blocks=*/true);
  g.submit_pending();
  std::thread helper([&] { g.n1->help_until(settled_at_least(g.l1, 1), 30s); });
  std::this_thread::sleep_for(50ms);
  const auto t0 = Clock::now();
  g.fake.reset();  // the "crash"
  helper.join();
  EXPECT_LT(Clock::now() - t0, 10s);
  ASSERT_TRUE(g.l1.wait_settled(1, 1s));
  ASSERT_EQ(g.l1.failures.size(), 1u);
  EXPECT_EQ(g.l1.failures[0].second.code, Status::Code::peer_lost);
  EXPECT_NE(g.l1.failures[0].second.message.find("rank 2"), std::string::npos) << g.l1.failures[0].second.message;
}

// Where groups run on an executor thread (execute_blocks off) there is nothing to lend: help_until returns at once.
TEST(NegotiatorHelp, WithoutBlockingExecutionHelpReturnsAtOnce) {
  Group g(2);
  const auto t0 = Clock::now();
  g.rank(1).help_until([] { return false; }, 10s);
  EXPECT_LT(Clock::now() - t0, 5s);
}

}  // namespace
}  // namespace commsched::collective
