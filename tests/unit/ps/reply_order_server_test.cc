// A real server's reply order, seen by a worker played by hand: with several sums ready the server sends the most
// urgent first (scheduler/reply_order.h) and every receipt ahead of them, and its bound keeps the least urgent from
// starving. The server's link is EMULATED at 100 Mbit/s, so its transport holds each 1 MiB sum for about 84 ms: the
// nine pushes below have all arrived while the first sums still leave, and the rest wait in the server's queue.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm_backends/ps/server.h"
#include "tests/unit/ps/one_server.h"

namespace commsched::ps {
namespace {

constexpr uint64_t kSumBytes = 1 << 20;  // the server's window: one sum fills it

struct Order {
  std::vector<int32_t> sums;  // priorities, in the order the worker received them
  size_t receipts_before_third_sum = 0;
};

// Pushes of 1 MiB with these priorities, in this order, each asking for a receipt; one worker, so each is its own
// sum at once.
Order run(uint64_t bound, const std::vector<int32_t>& priorities) {
  PsConfig cfg;
  cfg.emulate_rate_bps = 100e6;
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
    if (o.sums.size() == 3) o.receipts_before_third_sum = receipts;
  }
  return o;
}

// 50 and 60 first, then the one that could starve (100), then urgent ones, least urgent first.
const std::vector<int32_t> kPushes = {50, 60, 100, 5, 4, 3, 2, 1, 0};

TEST(PsServerReplyOrder, SendsTheMostUrgentReadySumFirstAndReceiptsAheadOfSums) {
  const Order o = run(ReplyOrder<int>::kDefaultMaxOvertakes, kPushes);
  ASSERT_EQ(o.sums.size(), kPushes.size()) << "not every sum came";
  EXPECT_EQ(o.sums.front(), 50);  // sent before anything else was ready
  // The second left while the others arrived (the most urgent there was then); the rest waited together.
  const std::vector<int32_t> rest(o.sums.begin() + 2, o.sums.end());
  EXPECT_TRUE(std::is_sorted(rest.begin(), rest.end())) << ::testing::PrintToString(o.sums);
  EXPECT_EQ(o.sums.back(), 100);
  EXPECT_LT(std::find(o.sums.begin(), o.sums.end(), 0) - o.sums.begin(), 3) << ::testing::PrintToString(o.sums);
  EXPECT_EQ(o.receipts_before_third_sum, kPushes.size());
}

// Bound 2: the least urgent goes once two replies have left since it was ready (older ones forced first), not last.
TEST(PsServerReplyOrder, NothingStarvesBeyondTheBound) {
  const Order o = run(2, kPushes);
  ASSERT_EQ(o.sums.size(), kPushes.size()) << "not every sum came";
  const auto at = std::find(o.sums.begin(), o.sums.end(), 100) - o.sums.begin();
  EXPECT_LE(at, 5) << ::testing::PrintToString(o.sums);
}

// Bound 0: arrival order, as before the rule.
TEST(PsServerReplyOrder, BoundZeroAnswersInArrivalOrder) {
  const Order o = run(0, kPushes);
  EXPECT_EQ(o.sums, kPushes);
}

}  // namespace
}  // namespace commsched::ps
