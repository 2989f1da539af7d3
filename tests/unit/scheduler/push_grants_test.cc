// Receiver-driven admission at a PS server (scheduler/push_grants.h): most urgent first across workers, ties in
// announcement order, at most a window of granted bytes on their way, and no announced push passed over forever.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "scheduler/push_grants.h"

namespace commsched {
namespace {

// Worker w's push of the partition with priority p: id w * 1000 + p.
PushGrants::Push push(uint64_t worker, int32_t priority, uint64_t bytes = 100) {
  return {worker * 1000 + uint64_t(priority), priority, bytes};
}

std::vector<uint64_t> drain(PushGrants& g) {
  std::vector<uint64_t> ids;
  while (auto p = g.next()) {
    ids.push_back(p->id);
    g.arrived(p->bytes);
  }
  return ids;
}

TEST(PushGrants, MostUrgentFirstAcrossWorkersTiesInAnnouncementOrder) {
  PushGrants g(1);  // one push on its way at a time: the order is the rule's alone
  g.announce(push(1, 40));  // a worker still in its backward: bulk
  g.announce(push(2, 41));
  g.announce(push(3, 0));   // an early worker's first-needed layer, announced after them
  g.announce(push(2, 40));
  g.announce(push(1, 0));
  EXPECT_EQ(drain(g), (std::vector<uint64_t>{3000, 1000, 1040, 2040, 2041}));
  EXPECT_EQ(g.waiting(), 0u);
  EXPECT_EQ(g.in_flight(), 0u);
}

TEST(PushGrants, GrantsWhileFewerThanTheWindowAreOnTheirWay) {
  PushGrants g(300);
  for (int32_t p = 0; p < 6; ++p) g.announce(push(0, p, 100));
  for (int32_t p = 0; p < 3; ++p) EXPECT_EQ(g.next()->priority, p);
  EXPECT_FALSE(g.next()) << "300 bytes on their way fill a 300-byte window";
  EXPECT_EQ(g.in_flight(), 300u);
  g.arrived(100);
  EXPECT_EQ(g.next()->priority, 3);
  EXPECT_FALSE(g.next());
  // One push bigger than the window still goes once the window is not full (else it would never go).
  PushGrants big(64);
  big.announce(push(0, 0, 1000));
  EXPECT_EQ(big.next()->bytes, 1000u);
  EXPECT_FALSE(big.next());
}

// An urgent push announced while the window is full goes next, ahead of the bulk announced before it.
TEST(PushGrants, AnUrgentPushWaitsOnlyForRoomNotForTheBulk) {
  PushGrants g(200);
  for (int32_t p = 50; p < 60; ++p) g.announce(push(1, p));
  ASSERT_TRUE(g.next() && g.next());
  ASSERT_FALSE(g.next());
  g.announce(push(2, 0));
  g.arrived(100);
  EXPECT_EQ(g.next()->id, 2000u);
}

// A stream of urgent pushes keeps coming; the least urgent one is still granted once `bound` grants have been issued
// since it was announced, and no later.
TEST(PushGrants, NoAnnouncedPushIsPassedOverMoreThanTheBound) {
  for (uint64_t bound : {1, 4, 16}) {
    PushGrants g(1, bound);
    g.announce(push(7, 99));
    uint64_t passed_over = 0;
    for (int32_t n = 0;; ++n) {
      g.announce(push(uint64_t(n % 5), 0));  // another worker's urgent push before every grant
      const auto p = g.next();
      ASSERT_TRUE(p);
      g.arrived(p->bytes);
      if (p->id == 7099) break;
      ASSERT_LT(++passed_over, bound + 1) << "bound " << bound;
    }
    EXPECT_EQ(passed_over, bound) << "bound " << bound;
  }
}

// Random traffic, arrivals in any order: never more than the window plus one push's bytes, less one, on their way, and
// every announced push is granted.
TEST(PushGrants, RandomTrafficKeepsTheWindowAndGrantsEverything) {
  std::mt19937 rng{26};
  const uint64_t window = 1000, largest = 400;
  PushGrants g(window, 8);
  std::vector<PushGrants::Push> on_way;
  uint64_t announced = 0, granted = 0;
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 2 == 0) {
      g.announce({announced++, int32_t(rng() % 10), 1 + rng() % largest});
    } else if (!on_way.empty()) {
      const size_t i = rng() % on_way.size();
      g.arrived(on_way[i].bytes);
      on_way.erase(on_way.begin() + std::ptrdiff_t(i));
    }
    while (auto p = g.next()) {
      on_way.push_back(*p);
      ++granted;
      ASSERT_LT(g.in_flight(), window + largest);
    }
  }
  while (granted < announced) {
    ASSERT_FALSE(on_way.empty()) << "announced pushes wait with nothing on its way";
    g.arrived(on_way.back().bytes);
    on_way.pop_back();
    while (auto p = g.next()) on_way.push_back(*p), ++granted;
  }
  EXPECT_EQ(g.waiting(), 0u);
}

TEST(PushGrants, RejectsAZeroWindowAnEmptyPushAndBytesNeverGranted) {
  EXPECT_THROW(PushGrants(0), std::invalid_argument);
  PushGrants g(100);
  EXPECT_THROW(g.announce(push(0, 1, 0)), std::invalid_argument);
  EXPECT_THROW(g.arrived(1), std::logic_error);
  g.announce(push(0, 1, 50));
  ASSERT_TRUE(g.next());
  EXPECT_THROW(g.arrived(51), std::logic_error);
  g.arrived(50);
  EXPECT_EQ(g.in_flight(), 0u);
}

// The sizes from the cluster's shape: 10 Gbit/s moves 75 000 bytes over a round trip of two 25 us latencies and two
// 5 us message costs; the window is four of them, and a push smaller than one goes without a grant.
TEST(PushGrants, SizesFollowTheLinksRoundTrip) {
  EXPECT_EQ(grant_min_bytes(10e9, 25e-6, 5e-6), 75'000u);
  EXPECT_EQ(grant_window_bytes(10e9, 25e-6, 5e-6), uint64_t(75'000 * kGrantWindowRoundTrips));
  EXPECT_EQ(grant_window_bytes(100e9, 25e-6, 5e-6), 10 * grant_window_bytes(10e9, 25e-6, 5e-6));
  EXPECT_EQ(grant_window_bytes(10e9, 0, 0), 1u) << "never an empty window";
}

// The worker's side (Homa-like): a push goes without a grant while its server's unscheduled budget holds it, each
// server's budget apart, and again once earlier unscheduled bytes have arrived; bulk beyond it waits for a grant.
TEST(UnscheduledPushes, BulkGoesUnscheduledWithinEachServersBudget) {
  UnscheduledPushes u(2, 300, /*urgent_below=*/0);
  EXPECT_TRUE(u.admit(0, 50, 200));
  EXPECT_TRUE(u.admit(0, 51, 100)) << "exactly the budget";
  EXPECT_FALSE(u.admit(0, 52, 1)) << "beyond it: announced, waits for a grant";
  EXPECT_TRUE(u.admit(1, 52, 300)) << "another server's budget is its own";
  EXPECT_EQ(u.in_flight(0), 300u);
  u.arrived(0, 200);
  EXPECT_TRUE(u.admit(0, 53, 150));
  EXPECT_FALSE(u.admit(0, 54, 100));
  EXPECT_EQ(u.in_flight(0), 250u);
  UnscheduledPushes none(1, 0, 0);
  EXPECT_FALSE(none.admit(0, 0, 1)) << "no budget, no urgent priorities: every push asks";
}

// The backward's last stretch (priority below urgent_below) goes at once whatever the budget, and its bytes count in
// it, so the bulk behind it asks for a grant while they are on their way.
TEST(UnscheduledPushes, UrgentPushesGoAtOnceAndFillTheBudget) {
  UnscheduledPushes u(1, 100, /*urgent_below=*/3);
  EXPECT_TRUE(u.admit(0, 2, 1000));
  EXPECT_TRUE(u.admit(0, 0, 1000));
  EXPECT_FALSE(u.admit(0, 3, 1)) << "priority 3 is bulk; the budget is spent";
  u.arrived(0, 2000);
  EXPECT_TRUE(u.admit(0, 3, 100));
}

TEST(UnscheduledPushes, RejectsNoServersAnUnknownServerAndBytesNeverSent) {
  EXPECT_THROW(UnscheduledPushes(0, 100, 0), std::invalid_argument);
  UnscheduledPushes u(2, 100, 0);
  EXPECT_THROW(u.admit(2, 0, 1), std::out_of_range);
  EXPECT_THROW(u.arrived(0, 1), std::logic_error);
  ASSERT_TRUE(u.admit(1, 0, 60));
  EXPECT_THROW(u.arrived(1, 61), std::logic_error);
  EXPECT_THROW(u.arrived(5, 1), std::out_of_range);
}

}  // namespace
}  // namespace commsched
