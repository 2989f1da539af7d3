// Straggler reports (comm_backends/straggler.h): the wire text round-trips and refuses garbage; the board merges
// the sources' reports and rate-limits its log lines.
#include <gtest/gtest.h>

#include "comm_backends/straggler.h"

using namespace commsched;
using namespace std::chrono_literals;

TEST(Stragglers, TextRoundTripsAndRefusesGarbage) {
  const std::vector<Straggler> lags{{3, 2, 0.5}, {1, 0, 0.031}};
  const auto back = decode_stragglers(encode_stragglers(lags), 4);
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].rank, 3);
  EXPECT_EQ((*back)[0].iterations, 2u);
  EXPECT_DOUBLE_EQ((*back)[0].seconds, 0.5);
  EXPECT_TRUE(decode_stragglers("", 4) && decode_stragglers("", 4)->empty());
  for (const char* bad : {"4 1 0.5\n", "-1 1 0.5\n", "1 1\n", "1 1 0.5 7\n", "x y z\n", "1 1 -2\n", "1 -1 0.5\n",
                          "1 +1 0.5\n", "1 1x 0.5\n"})
    EXPECT_FALSE(decode_stragglers(bad, 4)) << bad;
}

TEST(Stragglers, TheBoardMergesSourcesAndRateLimitsItsLog) {
  StragglerBoard board(2, 1.0, 5s);
  const auto t0 = StragglerBoard::Clock::now();
  EXPECT_TRUE(board.report(0, {{2, 1, 0.5}}, t0).empty()) << "logged a lag under the warning threshold";
  const auto lines = board.report(1, {{2, 3, 1.5}, {1, 1, 1.2}}, t0);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("rank 2 lags: 3 iteration(s) behind"), std::string::npos) << lines[0];
  EXPECT_TRUE(board.report(1, {{2, 3, 2.0}}, t0 + 1s).empty()) << "logged rank 2 again within 5 s";
  auto now = board.current(t0 + 2s);
  ASSERT_EQ(now.size(), 2u) << "rank 1, no longer in source 1's report, is kept 3 s";
  EXPECT_EQ(now[0].rank, 2);
  EXPECT_EQ(now[0].iterations, 3u);  // the worst of both sources
  EXPECT_EQ(now[0].seconds, 2.0);
  EXPECT_EQ(now[1].rank, 1);
  EXPECT_EQ(board.report(1, {{2, 3, 2.0}}, t0 + 6s).size(), 1u);
  now = board.current(t0 + 6s);
  ASSERT_EQ(now.size(), 1u) << "rank 1's lag, last heard at t0, outlived the 3 s kept";
  board.report(0, {}, t0 + 7s);
  board.report(1, {}, t0 + 7s);
  EXPECT_EQ(board.current(t0 + 8s).size(), 1u) << "rank 2, last heard at t0+6s, is kept until t0+9s";
  EXPECT_TRUE(board.current(t0 + 10s).empty());
}
