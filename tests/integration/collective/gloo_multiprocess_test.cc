// Ranks as processes on loopback with the Gloo backend: random tasks submitted in a different order on every rank give
// exact results without deadlock; a killed rank makes every survivor fail its pending work within 10 s.
#include <gtest/gtest.h>

#include <chrono>

#include "plugins/launch/process_group.h"

#ifndef GLOO_RANK_BIN
#error "GLOO_RANK_BIN must name the gloo_rank executable"
#endif

namespace commsched::testing {
namespace {

std::string describe(const RankExit& e) {
  return "rank " + std::to_string(e.rank) + (e.exited ? " exited with " : " killed by signal ") + std::to_string(e.code);
}

struct RandomCase {
  int ranks;
  uint64_t seed;
};

class GlooRandomOrder : public ::testing::TestWithParam<RandomCase> {};

TEST_P(GlooRandomOrder, ExactResultsWhateverTheSubmissionOrder) {
  const auto [ranks, seed] = GetParam();
  RankProcesses procs(GLOO_RANK_BIN, {"random", std::to_string(seed), "3"}, ranks, {{"COMMSCHED_TIMEOUT", "5"}});
  for (const auto& e : procs.wait(std::chrono::seconds(90))) {
    EXPECT_TRUE(e.exited && e.code == 0) << describe(e) << " (see its output above)";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooRandomOrder,
                         ::testing::Values(RandomCase{2, 1}, RandomCase{2, 7}, RandomCase{4, 3}, RandomCase{4, 11}),
                         [](const auto& info) {
                           return std::to_string(info.param.ranks) + "ranks_seed" + std::to_string(info.param.seed);
                         });

// Every link of the run proves the shared secret (the store and the negotiation): results as exact as without one.
TEST(GlooWithSecret, ExactResultsWhenEveryRankProvesTheSecret) {
  RankProcesses procs(GLOO_RANK_BIN, {"random", "5", "3"}, 3,
                      {{"COMMSCHED_TIMEOUT", "5"}, {"COMMSCHED_SECRET", "gloo-test-secret-0123456789"}});
  for (const auto& e : procs.wait(std::chrono::seconds(90))) {
    EXPECT_TRUE(e.exited && e.code == 0) << describe(e) << " (see its output above)";
  }
}

// A rank that reaches the mesh several silence timeouts after the others (a slow framework import) still joins: the
// ranks wait for each other as long as the rest of the rendezvous does, and only collectives run on the short timeout.
TEST(GlooLateRank, ARankStartingLaterThanTheTimeoutStillJoins) {
  RankProcesses procs(GLOO_RANK_BIN, {"random", "9", "2"}, 3,
                      {{"COMMSCHED_TIMEOUT", "2"}, {"GLOO_TEST_LATE_RANK", "2:7"}});
  for (const auto& e : procs.wait(std::chrono::seconds(90))) {
    EXPECT_TRUE(e.exited && e.code == 0) << describe(e) << " (see its output above)";
  }
}

struct EngineCase {
  int ranks;
  const char* policy;
};

class GlooThroughEngine : public ::testing::TestWithParam<EngineCase> {};

TEST_P(GlooThroughEngine, ExactResultsWithPartitioningAndCredit) {
  const auto [ranks, policy] = GetParam();
  RankProcesses procs(GLOO_RANK_BIN, {"engine", "21", "2", policy}, ranks,
                      {{"COMMSCHED_TIMEOUT", "5"}});
  for (const auto& e : procs.wait(std::chrono::seconds(90))) {
    EXPECT_TRUE(e.exited && e.code == 0) << describe(e) << " (see its output above)";
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, GlooThroughEngine,
                         ::testing::Values(EngineCase{2, "bytescheduler"}, EngineCase{4, "bytescheduler"},
                                           EngineCase{2, "wfbp"}, EngineCase{2, "bsp"}, EngineCase{2, "fusion"},
                                           EngineCase{3, "mgwfbp"}),
                         [](const auto& info) {
                           return std::to_string(info.param.ranks) + "ranks_" + std::string(info.param.policy);
                         });

struct KillCase {
  int ranks;
  int victim;
};

class GlooKilledRank : public ::testing::TestWithParam<KillCase> {};

TEST_P(GlooKilledRank, SurvivorsFailWithPeerLostWithinTenSeconds) {
  const auto [ranks, victim] = GetParam();
  // Default COMMSCHED_TIMEOUT (8 s): a crash must be noticed from the closed connection, well inside the bound.
  RankProcesses procs(GLOO_RANK_BIN, {"kill", "5", std::to_string(victim)}, ranks);
  const auto exits = procs.wait(std::chrono::seconds(60));
  ASSERT_FALSE(exits[victim].exited) << describe(exits[victim]);
  EXPECT_EQ(exits[victim].code, SIGKILL);
  for (const auto& e : exits) {
    if (e.rank == victim) continue;
    EXPECT_TRUE(e.exited && e.code == 0) << describe(e) << " (see its output above)";
    const double after = std::chrono::duration<double>(e.when - exits[victim].when).count();
    EXPECT_LT(after, 10.0) << "rank " << e.rank << " took " << after << " s to give up after the victim died";
  }
}

TEST(GlooHungRank, SurvivorsFailWithPeerLostWithinTenSecondsByDefault) {
  // A stopped process keeps its connections open: only heartbeats stopping can tell. Each survivor checks itself that
  // its pending work failed with peer_lost within 10 s (default COMMSCHED_TIMEOUT); the stopped victim is killed when
  // the wait ends.
  RankProcesses procs(GLOO_RANK_BIN, {"hang", "6", "1"}, 3);
  const auto exits = procs.wait(std::chrono::seconds(12));
  for (size_t r = 0; r < exits.size(); ++r) {
    if (r == 1) continue;
    EXPECT_TRUE(exits[r].exited && exits[r].code == 0) << describe(exits[r]) << " (see its output above)";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooKilledRank,
                         ::testing::Values(KillCase{2, 1}, KillCase{2, 0}, KillCase{4, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.ranks) + "ranks_victim" + std::to_string(info.param.victim);
                         });

}  // namespace
}  // namespace commsched::testing
