// The server's reply order (scheduler/reply_order.h): receipts first, then the most urgent partition, then arrival;
// and the bound that keeps every reply from starving.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <tuple>
#include <string>
#include <vector>

#include "scheduler/reply_order.h"

namespace commsched {
namespace {

std::vector<std::string> drain(ReplyOrder<std::string>& q) {
  std::vector<std::string> out;
  while (!q.empty()) out.push_back(q.pop());
  return out;
}

TEST(ReplyOrder, ReceiptsFirstThenLowestPriorityThenArrival) {
  ReplyOrder<std::string> q;
  q.push("sum p7 a", false, 7);
  q.push("sum p2", false, 2);
  q.push("receipt p9", true, 9);
  q.push("sum p7 b", false, 7);
  q.push("receipt p1", true, 1);
  q.push("sum p-3", false, -3);
  EXPECT_EQ(drain(q), (std::vector<std::string>{"receipt p1", "receipt p9", "sum p-3", "sum p2", "sum p7 a",
                                                "sum p7 b"}));
}

TEST(ReplyOrder, AmongReceiptsTheMostUrgentFirst) {
  ReplyOrder<std::string> q;
  q.push("r5", true, 5);
  q.push("r0", true, 0);
  EXPECT_EQ(drain(q), (std::vector<std::string>{"r0", "r5"}));
}

// A stream of urgent replies keeps arriving; the one bulk reply still leaves once `bound` others have left since it
// became ready, and never later.
TEST(ReplyOrder, NothingWaitsBehindMoreThanTheBound) {
  for (uint64_t bound : {1, 3, 10}) {
    ReplyOrder<int> q(bound);
    q.push(1000, false, 100);  // the least urgent
    uint64_t sent_before = 0;
    int next = 0;
    for (;;) {
      q.push(next++, false, 0);  // one urgent reply ready before each send
      if (q.pop() == 1000) break;
      ++sent_before;
      ASSERT_LE(sent_before, bound) << "bound " << bound;
    }
    EXPECT_EQ(sent_before, bound) << "bound " << bound;
  }
}

// Replies forced by the bound leave oldest first, and the rule resumes afterwards.
TEST(ReplyOrder, ForcedRepliesLeaveOldestFirst) {
  ReplyOrder<std::string> q(2);
  q.push("old 9", false, 9);
  q.push("old 8", false, 8);
  q.push("urgent 1", false, 1);
  q.push("urgent 2", false, 2);
  EXPECT_EQ(q.pop(), "urgent 1");
  EXPECT_EQ(q.pop(), "urgent 2");
  q.push("urgent 0", false, 0);
  EXPECT_EQ(q.pop(), "old 9");  // two have left since it was ready
  EXPECT_EQ(q.pop(), "old 8");  // so have three by now
  EXPECT_EQ(q.pop(), "urgent 0");
  EXPECT_TRUE(q.empty());
}

// The rule stated plainly, every waiting reply looked at on each pop: what the queue must match.
class PlainOrder {
 public:
  explicit PlainOrder(uint64_t bound) : bound_(bound) {}
  void push(int reply, bool receipt, int32_t priority) { waiting_.push_back({reply, receipt ? 0 : 1, priority, sent_}); }
  int pop() {
    size_t pick = 0;  // the oldest, if it has waited long enough; else the most urgent, oldest among equals
    if (sent_ - waiting_[0].ready_at < bound_)
      for (size_t i = 1; i < waiting_.size(); ++i)
        if (std::tie(waiting_[i].rank, waiting_[i].priority) < std::tie(waiting_[pick].rank, waiting_[pick].priority))
          pick = i;
    const int reply = waiting_[pick].reply;
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(pick));
    ++sent_;
    return reply;
  }
  bool empty() const { return waiting_.empty(); }

 private:
  struct Waiting {
    int reply, rank;
    int32_t priority;
    uint64_t ready_at;
  };
  uint64_t bound_, sent_ = 0;
  std::vector<Waiting> waiting_;  // by arrival
};

// Runs of equal rank (a round's sums), receipts between them, pops interleaved, and bounds that force replies out
// of the middle of runs: the same order as the plain rule, reply by reply.
TEST(ReplyOrder, MatchesThePlainRuleOnRandomTraffic) {
  for (uint64_t bound : {1, 2, 5, 40, 256}) {
    std::mt19937 rng{unsigned(bound)};
    ReplyOrder<int> q(bound);
    PlainOrder plain(bound);
    int next = 0;
    for (int step = 0; step < 20000; ++step) {
      if (rng() % 2 == 0) {
        const bool receipt = rng() % 3 == 0;
        const int32_t priority = int32_t(rng() % 6);
        for (uint32_t n = 1 + rng() % (receipt ? 1 : 8); n > 0; --n) {
          q.push(next, receipt, priority);
          plain.push(next++, receipt, priority);
        }
      } else {
        for (uint32_t n = rng() % 6; n > 0 && !plain.empty(); --n) ASSERT_EQ(q.pop(), plain.pop()) << "bound " << bound;
      }
    }
    while (!plain.empty()) ASSERT_EQ(q.pop(), plain.pop()) << "bound " << bound;
    EXPECT_TRUE(q.empty());
  }
}

TEST(ReplyOrder, RejectsAZeroBoundAndAnEmptyPop) {
  EXPECT_THROW(ReplyOrder<int>(0), std::invalid_argument);
  ReplyOrder<int> q;
  EXPECT_THROW(q.pop(), std::logic_error);
  q.push(4, false, 0);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.pop(), 4);
  EXPECT_EQ(q.size(), 0u);
}

}  // namespace
}  // namespace commsched
