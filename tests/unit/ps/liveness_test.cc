#include "comm_backends/liveness.h"

#include <gtest/gtest.h>

namespace commsched {
namespace {
using namespace std::chrono_literals;
using Clock = Liveness::Clock;

const Clock::time_point t0 = Clock::time_point{} + 1h;

TEST(Liveness, SilentPeerIsLostAfterTheLimitAndNotBefore) {
  Liveness l(3s);
  l.watch(7, t0);
  EXPECT_FALSE(l.check(t0 + 3s));
  auto loss = l.check(t0 + 3s + 1ms);
  ASSERT_TRUE(loss);
  EXPECT_EQ(loss->peer, 7u);
  EXPECT_EQ(loss->why, "no message for 3 s (hung or unreachable; COMMSCHED_TIMEOUT)");
  EXPECT_TRUE(loss->also_silent.empty());
  EXPECT_EQ(loss->explain([](Liveness::Id) { return "unused"; }), loss->why);
  l.heard(7, t0 + 2s);
  EXPECT_FALSE(l.check(t0 + 4s));
}

// A hung sender can stop every peer's messages to this node at once (a shared-memory FIFO it froze mid-write):
// the longest silent is named first, and every peer silent for over half the limit with it.
TEST(Liveness, PeersSilentTogetherAreAllNamedLongestFirst) {
  Liveness l(4s);
  l.watch(1, t0 + 1s);
  l.watch(2, t0);          // the longest silent
  l.watch(3, t0 + 2500ms);  // silent 1.5 s at the check: under half the limit, not named
  l.watch(4, t0 + 1500ms);
  auto loss = l.check(t0 + 4s + 1ms);
  ASSERT_TRUE(loss);
  EXPECT_EQ(loss->peer, 2u);
  EXPECT_EQ(loss->also_silent, (std::vector<Liveness::Id>{1, 4}));
  EXPECT_EQ(loss->explain([](Liveness::Id id) { return "peer " + std::to_string(id); }),
            "no message for 4 s (hung or unreachable; COMMSCHED_TIMEOUT); also silent for over half that: peer 1, "
            "peer 4 (the hung one may be any of these)");
  // Silent for the same time: the lower id first, the same report for the same state.
  Liveness tie(1s);
  tie.watch(5, t0);
  tie.watch(3, t0);
  loss = tie.check(t0 + 2s);
  ASSERT_TRUE(loss);
  EXPECT_EQ(loss->peer, 3u);
  EXPECT_EQ(loss->also_silent, std::vector<Liveness::Id>{5});
}

TEST(Liveness, SilenceCountsOnlyOnceAPeerHasSpoken) {
  Liveness l(1s);
  l.watch(1);  // e.g. the root before it answers: the rendezvous timeout covers it
  EXPECT_FALSE(l.check(t0 + 1h));
  l.heard(1, t0);
  EXPECT_TRUE(l.check(t0 + 2s));
}

// A neighbour's "peer X lost" report may reach the loop after its disconnection: within the grace it still counts.
// A goodbye within the grace (the loop forgets the peer) means it left.
TEST(Liveness, ClosedPeerIsLostOnlyAfterTheGraceUnlessItSaysGoodbye) {
  Liveness l(10s, 300ms);
  l.watch(1, t0);
  l.watch(2, t0);
  l.closed(1, t0);
  l.closed(2, t0);
  EXPECT_FALSE(l.check(t0 + 299ms));
  l.forget(2);  // its goodbye
  auto loss = l.check(t0 + 300ms);
  ASSERT_TRUE(loss);
  EXPECT_EQ(loss->peer, 1u);
  EXPECT_EQ(loss->why, "connection closed");
}

TEST(Liveness, PeersThatEndedOrLeftAreNotPinged) {
  Liveness l(1s);
  l.watch(1, t0);
  l.watch(2, t0);
  l.watch(3, t0);
  l.forget(2);  // its goodbye
  l.closed(3, t0);
  EXPECT_EQ(l.expected(), std::vector<Liveness::Id>{1});
  l.forget(1);
  l.forget(3);
  EXPECT_FALSE(l.check(t0 + 1h));
}

TEST(Liveness, PollWaitShrinksWhileAGraceRunsOut) {
  Liveness l(10s, 300ms);
  l.watch(1, t0);
  EXPECT_EQ(l.poll_wait(1000ms, t0), 1000ms);
  l.closed(1, t0);
  EXPECT_EQ(l.poll_wait(1000ms, t0 + 100ms), 201ms);
  EXPECT_EQ(l.poll_wait(1000ms, t0 + 1s), 1ms);  // overdue: never a negative wait
  EXPECT_EQ(l.poll_wait(50ms, t0), 50ms);
}

TEST(Liveness, UnwatchedAndForgottenPeersAreIgnored) {
  Liveness l(1s, 0ms);
  l.closed(9, t0);
  l.heard(9, t0);
  EXPECT_FALSE(l.watching(9));
  l.watch(4, t0);
  l.forget(4);
  EXPECT_FALSE(l.check(t0 + 1h));
}

// The one heartbeat rule: a quarter of COMMSCHED_TIMEOUT within [20 ms, 1 s], or a loop's own option when it is set.
TEST(HeartbeatRule, AutomaticIntervalIsAQuarterOfTheTimeoutWithinBounds) {
  EXPECT_EQ(heartbeat_interval(2.0), 500ms);
  EXPECT_EQ(heartbeat_interval(8.0), 1000ms);   // at most one second
  EXPECT_EQ(heartbeat_interval(0.04), 20ms);    // at least 20 ms
  EXPECT_EQ(heartbeat_interval(8.0, 0.25), 250ms);
}

TEST(HeartbeatRule, AConfiguredIntervalAboveAQuarterOfTheTimeoutIsRefusedNamingTheOption) {
  EXPECT_NO_THROW(check_heartbeat("COMMSCHED_PS_HEARTBEAT", 2.0, 8.0));
  for (double bad : {0.0, -1.0, 2.5}) {
    try {
      check_heartbeat("COMMSCHED_PS_HEARTBEAT", bad, 8.0);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("COMMSCHED_PS_HEARTBEAT="), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("at most a quarter of COMMSCHED_TIMEOUT"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace commsched
