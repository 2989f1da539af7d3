// LagTracker: which worker holds the others back, and for how long.
#include <gtest/gtest.h>

#include "comm_backends/lag_tracker.h"

using commsched::LagTracker;
using namespace std::chrono_literals;

TEST(LagTracker, NamesTheWorkerTheOthersWaitForAndHowLong) {
  LagTracker t(3);
  const auto t0 = LagTracker::Clock::now();
  for (uint32_t w = 0; w < 3; ++w) t.pushed(w, 0, t0);
  t.pushed(0, 1, t0 + 100ms);  // workers 0 and 2 move on to iteration 1; worker 1 does not
  t.pushed(2, 1, t0 + 200ms);
  EXPECT_TRUE(t.laggards(t0 + 900ms, 1.0).empty()) << "0.8 s is under the threshold";
  const auto lags = t.laggards(t0 + 1600ms, 1.0);
  ASSERT_EQ(lags.size(), 1u);
  EXPECT_EQ(lags[0].worker, 1u);
  EXPECT_EQ(lags[0].iteration, 0u);
  EXPECT_EQ(lags[0].lead, 1u);
  EXPECT_NEAR(lags[0].seconds, 1.5, 1e-6);  // since worker 0 first pushed for iteration 1
  t.pushed(1, 1, t0 + 1700ms);
  EXPECT_TRUE(t.laggards(t0 + 5s, 1.0).empty()) << "it caught up";
}

TEST(LagTracker, WorkersThatNeverPushedAreNotBlamedAndOrderIsMostBehindFirst) {
  LagTracker t(4);
  const auto t0 = LagTracker::Clock::now();
  t.pushed(0, 5, t0);
  t.pushed(1, 3, t0);
  t.pushed(2, 4, t0);
  t.pushed(0, 6, t0 + 1s);
  const auto lags = t.laggards(t0 + 3s, 0.5);
  ASSERT_EQ(lags.size(), 2u);  // workers 1 and 2; worker 3 never pushed: not yet part of the picture
  EXPECT_EQ(lags[0].worker, 1u);
  EXPECT_EQ(lags[0].lead - lags[0].iteration, 3u);
}
