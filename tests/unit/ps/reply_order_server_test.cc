// A real server's reply order, seen by a worker played by hand: with several sums ready the server sends the most
// urgent first (scheduler/reply_order.h) and every receipt ahead of them, and its bound keeps the least urgent from
// starving. The server's link is EMULATED at a rate that holds each sum (the size of ReplyQueue's window) in its
// transport for about 400 ms: the eight pushes below have all arrived while the first sums still leave (the fourth
// is handed over once the second has left), and the rest wait in the server's queue (the transport holds at most two
// of them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm_backends/ps/reply_queue.h"
#include "comm_backends/ps/server.h"
#include "tests/unit/ps/one_server.h"

namespace commsched::ps {
namespace {

constexpr uint64_t kSumBytes = ReplyQueue::kWindowBytes;  // one sum fills the server's window of bytes

struct Order {
  std::vector<int32_t> sums;  // priorities, in the order the worker received them
  size_t receipts_before_fourth_sum = 0;
};

// Pushes of kSumBytes with these priorities, in this order, each asking for a receipt; one worker, so each is its own
// sum at once.
Order run(uint64_t bound, const std::vector<int32_t>& priorities) {
  PsConfig cfg;
  cfg.emulate_rate_bps = double(kSumBytes) * 8 / 0.4;
  cfg.reply_bound = static_cast<int>(bound);
  harness::OneServer s(cfg);
  std::vector<std::vector<std::byte>> data(priorities.size(), std::vector<std::byte>(kSumBytes, std::byte{1}));
  for (size_t i = 0; i < priorities.size(); ++i) {
    Header h = make_header(MsgType::push_pull, PeerRole::worker, 0);
    h.key = 100 + i;
    h.length = h.tensor_bytes = kSumBytes;
    h.request_id = i;
    h.priority = priorities[i];
    h.flags = kFlagAckReceipt;
    s.push(h, data[i]);
  }
  Order o;
  size_t receipts = 0;
  while (o.sums.size() < priorities.size()) {
    auto in = s.next_of({MsgType::sum, MsgType::received});
    if (!in) break;
    if (in->type == MsgType::received) {
      ++receipts;
      continue;
    }
    o.sums.push_back(in->priority);
    if (o.sums.size() == 4) o.receipts_before_fourth_sum = receipts;
  }
  return o;
}

// 50, 60 and 70 first, then the one that could starve (100), then urgent ones, least urgent first.
const std::vector<int32_t> kPushes = {50, 60, 70, 100, 3, 2, 1, 0};

TEST(PsServerReplyOrder, SendsTheMostUrgentReadySumFirstAndReceiptsAheadOfSums) {
  const Order o = run(ReplyOrder<int>::kDefaultMaxOvertakes, kPushes);
  ASSERT_EQ(o.sums.size(), kPushes.size()) << "not every sum came";
  EXPECT_EQ(o.sums[0], 50);  // sent before anything else was ready
  EXPECT_EQ(o.sums[1], 60);  // the transport may hold two
  // The third left when the first was through, while the others arrived (the most urgent there was then); the rest
  // waited together.
  const std::vector<int32_t> rest(o.sums.begin() + 3, o.sums.end());
  EXPECT_TRUE(std::is_sorted(rest.begin(), rest.end())) << ::testing::PrintToString(o.sums);
  EXPECT_EQ(o.sums.back(), 100);
  EXPECT_LT(std::find(o.sums.begin(), o.sums.end(), 0) - o.sums.begin(), 4) << ::testing::PrintToString(o.sums);
  EXPECT_EQ(o.receipts_before_fourth_sum, kPushes.size());
}

// Bound 2: the least urgent goes once two replies have left since it was ready (older ones forced first), not last.
TEST(PsServerReplyOrder, NothingStarvesBeyondTheBound) {
  const Order o = run(2, kPushes);
  ASSERT_EQ(o.sums.size(), kPushes.size()) << "not every sum came";
  const auto at = std::find(o.sums.begin(), o.sums.end(), 100) - o.sums.begin();
  EXPECT_LE(at, 5) << ::testing::PrintToString(o.sums);  // last (7) without the bound
}

// Bound 0: arrival order, as before the rule.
TEST(PsServerReplyOrder, BoundZeroAnswersInArrivalOrder) {
  const Order o = run(0, kPushes);
  EXPECT_EQ(o.sums, kPushes);
}

}  // namespace
}  // namespace commsched::ps
