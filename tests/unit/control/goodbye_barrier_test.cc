// The goodbye barrier alone: who has said goodbye, which ends of connections are losses, the deadline; and, for
// either side of the barrier (the node that collects the goodbyes before saying its own, the node that says its
// own first) with goodbyes and ends in any order, the barrier is passed exactly when the last member is gone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "comm_backends/control/goodbye_barrier.h"

using namespace std::chrono_literals;
using commsched::control::GoodbyeBarrier;
using Id = GoodbyeBarrier::Id;
using Clock = GoodbyeBarrier::Clock;

TEST(GoodbyeBarrier, PassedOnceEveryAwaitedMemberSaidGoodbye) {
  GoodbyeBarrier b;
  for (Id m : {3, 1, 2}) b.await(m);
  const auto now = Clock::now();
  EXPECT_FALSE(b.passed(now));
  EXPECT_TRUE(b.said_bye(1));
  EXPECT_FALSE(b.said_bye(1)) << "a repeat is no news";
  EXPECT_FALSE(b.said_bye(9)) << "not awaited";
  EXPECT_TRUE(b.said_bye(3));
  EXPECT_TRUE(b.left(3));
  EXPECT_FALSE(b.left(2));
  EXPECT_FALSE(b.left(9));
  EXPECT_EQ(b.missing(), std::vector<Id>{2});
  EXPECT_FALSE(b.all_left());
  EXPECT_TRUE(b.said_bye(2));
  EXPECT_TRUE(b.all_left());
  EXPECT_TRUE(b.passed(now));
}

TEST(GoodbyeBarrier, NobodyToWaitForIsPassedAtOnce) {
  GoodbyeBarrier b;
  EXPECT_TRUE(b.passed(Clock::now()));
}

// Before any goodbye, an end is a loss; after the member's goodbye, or after this node's own, it is not.
TEST(GoodbyeBarrier, AnEndIsALossUnlessAGoodbyeCameFirst) {
  GoodbyeBarrier b;
  for (Id m : {1, 2, 3}) b.await(m);
  EXPECT_FALSE(b.ended(1));
  EXPECT_FALSE(b.left(1)) << "a lost member has not left";
  b.said_bye(2);
  EXPECT_TRUE(b.ended(2));
  EXPECT_FALSE(b.leaving());
  b.leave();
  EXPECT_TRUE(b.leaving());
  EXPECT_TRUE(b.ended(3)) << "this node said goodbye: it waits for nothing more from 3";
  EXPECT_TRUE(b.left(3));
  EXPECT_TRUE(b.ended(7)) << "nor from anybody";
}

TEST(GoodbyeBarrier, TheDeadlinePassesItWithoutTheMissingGoodbyes) {
  GoodbyeBarrier b;
  b.await(1);
  const auto t0 = Clock::now();
  EXPECT_FALSE(b.passed(t0 + 1h)) << "no deadline: it waits";
  b.wait_until(t0 + 2s);
  b.wait_until(t0 + 5s);  // the earliest counts
  EXPECT_FALSE(b.passed(t0 + 1s));
  EXPECT_TRUE(b.passed(t0 + 2s));
  EXPECT_EQ(b.missing(), std::vector<Id>{1});
}

namespace {

// Either side of the barrier, `members` awaited, goodbyes and ends shuffled with `seed`.
struct Case {
  bool says_first;  // this node says its goodbye before the others' (a negotiator rank, waiting for all_bye)
  int members;
  unsigned seed;
};

class BarrierInAnyOrder : public testing::TestWithParam<Case> {};

}  // namespace

TEST_P(BarrierInAnyOrder, PassedExactlyWhenTheLastMemberIsGone) {
  const Case c = GetParam();
  GoodbyeBarrier b;
  for (int m = 0; m < c.members; ++m) b.await(static_cast<Id>(m));
  if (c.says_first) b.leave();
  // Each member says goodbye and its connection ends, in that order; this node sees the events interleaved.
  // Where this node said goodbye first, a member may end without its own (it answered by closing).
  struct Event {
    Id member;
    bool end;
  };
  std::vector<Event> events;
  std::mt19937 rng(c.seed);
  for (int m = 0; m < c.members; ++m) {
    const bool skips_bye = c.says_first && rng() % 2;
    if (!skips_bye) events.push_back({static_cast<Id>(m), false});
    events.push_back({static_cast<Id>(m), true});
  }
  std::shuffle(events.begin(), events.end(), rng);
  // Per member, its goodbye before its end (TCP keeps one connection's order).
  for (int m = 0; m < c.members; ++m) {
    std::vector<size_t> at;
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].member == static_cast<Id>(m)) at.push_back(i);
    if (at.size() == 2) events[at[0]].end = false, events[at[1]].end = true;
  }
  std::vector<bool> gone(static_cast<size_t>(c.members), false);
  const auto now = Clock::now();
  for (const Event& e : events) {
    if (e.end) EXPECT_TRUE(b.ended(e.member)) << "member " << e.member << "'s end after a goodbye is no loss";
    else b.said_bye(e.member);
    gone[e.member] = true;
    const bool all = std::all_of(gone.begin(), gone.end(), [](bool g) { return g; });
    EXPECT_EQ(b.passed(now), all) << "after member " << e.member << (e.end ? "'s end" : "'s goodbye");
  }
  EXPECT_TRUE(b.passed(now));
  EXPECT_TRUE(b.missing().empty());
}

INSTANTIATE_TEST_SUITE_P(Sides, BarrierInAnyOrder,
                         testing::ValuesIn([] {
                           std::vector<Case> cases;
                           for (bool first : {false, true})
                             for (int n : {1, 3, 8})
                               for (unsigned seed : {1u, 2u, 3u}) cases.push_back({first, n, seed});
                           return cases;
                         }()),
                         [](const testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.says_first ? "says_first" : "collects_first") + "_" +
                                  std::to_string(i.param.members) + "members_seed" + std::to_string(i.param.seed);
                         });
