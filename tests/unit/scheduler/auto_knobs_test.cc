#include "scheduler/auto_knobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>

namespace commsched {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

// The PS partition is the power of two nearest sqrt(B m R / min(W, S)) (B = kPsReferenceBytes, m = kPsMessageS),
// within [16 KiB, 4 MiB]; the credit 2(W + 1) partitions up to 16 MiB, at least (W + 1).
TEST(AutoKnobs, PsPartitionWeighsIncastAgainstPerMessageCostAndCreditCoversTwoRoundsUpToACap) {
  struct Case {
    int workers;
    double bps;
    uint64_t partition;
    uint64_t credit;
  };
  for (const Case& c : {Case{2, 10e9, 512 * KiB, 6 * 512 * KiB}, Case{8, 10e9, 256 * KiB, 18 * 256 * KiB},
                        Case{16, 10e9, 128 * KiB, 34 * 128 * KiB}, Case{64, 10e9, 64 * KiB, 130 * 64 * KiB},
                        Case{256, 10e9, 32 * KiB, 16 * MiB}, Case{16, 1e9, 64 * KiB, 34 * 64 * KiB},
                        Case{16, 25e9, 256 * KiB, 34 * 256 * KiB}, Case{16, 100e9, 512 * KiB, 16 * MiB},
                        Case{256, 1e9, 16 * KiB, 514 * 16 * KiB}, Case{1024, 1e9, 16 * KiB, 1025 * 16 * KiB},
                        Case{2, 1600e9, 4 * MiB, 16 * MiB}}) {
    SCOPED_TRACE(std::to_string(c.workers) + " workers, " + std::to_string(c.bps / 1e9) + " Gbit/s");
    const AutoKnobs k = auto_knobs({c.workers, c.workers, c.bps});
    EXPECT_EQ(k.knobs.partition_bytes, c.partition);
    EXPECT_EQ(k.knobs.credit_bytes, c.credit);
    EXPECT_EQ(k.knobs.small_tensor_bytes, 0u) << "the parameter server keeps its fusion off";
  }
}

// The rule's cost, max(1, W / S) B m / p + W p / R, is least at the chosen partition among the powers of two in range.
TEST(AutoKnobs, PsPartitionIsTheCheapestPowerOfTwoUnderItsCostModel) {
  for (int workers : {2, 4, 8, 16, 64, 256}) {
    for (int servers : {1, workers / 2, workers}) {
      for (double bps : {1e9, 10e9, 25e9, 100e9}) {
        SCOPED_TRACE(std::to_string(workers) + " workers, " + std::to_string(servers) + " servers, " +
                     std::to_string(bps / 1e9) + " Gbit/s");
        const auto cost = [&](double p) {
          return std::max(1.0, double(workers) / servers) * kPsReferenceBytes * kPsMessageS / p +
                 workers * p / (bps / 8);
        };
        const uint64_t chosen = auto_knobs({workers, servers, bps}).knobs.partition_bytes;
        EXPECT_TRUE(std::has_single_bit(chosen));
        for (uint64_t p = 16 * KiB; p <= 4 * MiB; p *= 2)
          EXPECT_LE(cost(double(chosen)), cost(double(p)) * 1.0001) << p;
      }
    }
  }
}

TEST(AutoKnobs, PsPartitionGrowsWithTheLinkAndShrinksWithTheFanIn) {
  for (int workers : {2, 8, 32, 128}) {
    uint64_t previous = 0;
    for (double bps : {1e9, 10e9, 25e9, 100e9}) {
      const uint64_t p = auto_knobs({workers, workers, bps}).knobs.partition_bytes;
      EXPECT_GE(p, previous) << workers << " workers, " << bps / 1e9 << " Gbit/s";
      previous = p;
    }
  }
  // The fan-in is min(W, S): 64 workers into 4 servers pay the per-message cost 16 times over at each server.
  EXPECT_EQ(auto_knobs({64, 4, 10e9}).knobs.partition_bytes, auto_knobs({4, 4, 10e9}).knobs.partition_bytes);
  EXPECT_GT(auto_knobs({64, 4, 10e9}).knobs.partition_bytes, auto_knobs({64, 64, 10e9}).knobs.partition_bytes);
  // An unknown link is the assumed one.
  EXPECT_EQ(auto_knobs({16, 16}).knobs.partition_bytes, auto_knobs({16, 16, kAssumedLinkBps}).knobs.partition_bytes);
}

// Workers that fill their host's cores pay each message out of their compute: m is the measured 1.2 ms, not 5 us.
TEST(AutoKnobs, WorkersFillingTheirHostsCoresPayTheSharedCoresMessageCost) {
  EXPECT_EQ(ps_message_cost(2, 2).seconds, kPsMessageSharedCoresS);
  EXPECT_EQ(ps_message_cost(4, 2).seconds, kPsMessageSharedCoresS);
  EXPECT_EQ(ps_message_cost(1, 2).seconds, kPsMessageS) << "a core to spare";
  EXPECT_EQ(ps_message_cost(8, 64).seconds, kPsMessageS);
  EXPECT_EQ(ps_message_cost(2, 0).seconds, kPsMessageS) << "cores unknown";
  EXPECT_EQ(ps_message_cost(8, 8, 8).seconds, kPsMessageS) << "GPU workers bound to 8 cores each compute on their GPUs";
  EXPECT_EQ(ps_message_cost(2, 2, 0).seconds, kPsMessageSharedCoresS) << "no GPU: the CPU computes";

  // The main job's shape (2 workers, 1 server, 1 Gbit/s): sqrt(64 MiB x 1.2 ms x 125 MB/s) = 3.17 MB -> 4 MiB, where
  // the 5 us default gives 256 KiB; the credit follows the partition (2 x 3 x 4 MiB, capped at 16 MiB). At 100 Mbit/s
  // 1.0 MB -> 1 MiB.
  const ClusterShape shared{2, 1, 1e9, 0, ps_message_cost(2, 2)};
  EXPECT_EQ(auto_knobs({2, 1, 1e9}).knobs.partition_bytes, 256 * KiB);
  EXPECT_EQ(auto_knobs(shared).knobs.partition_bytes, 4 * MiB);
  EXPECT_EQ(auto_knobs(shared).knobs.credit_bytes, 16 * MiB);
  EXPECT_EQ(auto_knobs({2, 1, 100e6, 0, ps_message_cost(2, 2)}).knobs.partition_bytes, 1 * MiB);
  EXPECT_EQ(auto_knobs({2, 1, 10e9, 0, ps_message_cost(2, 2)}).knobs.partition_bytes, 4 * MiB) << "the PS chunk";
  EngineConfig c;
  const std::string why = apply_auto_knobs(c, shared);
  EXPECT_NE(why.find("2 workers x 1 servers (1200 us per message: the workers fill the host's cores)"),
            std::string::npos) << why;
  EXPECT_NE(apply_auto_knobs(c, {2, 1, 1e9, 0, {}}).find("(5 us per message)"), std::string::npos)
      << "0: the default";
}

// The log gives the reason the rule gave with the cost, never one guessed from the cost's value: the same 1.2 ms
// given without the rule's reason (a measured cost) is not said to come from full cores, and GPU workers on full
// cores keep the default without a reason.
TEST(AutoKnobs, TheLogGivesTheReasonTheRuleChoseTheMessageCostFor) {
  EXPECT_EQ(ps_message_cost(2, 2).why, "the workers fill the host's cores");
  EXPECT_EQ(ps_message_cost(1, 2).why, "");
  EXPECT_EQ(ps_message_cost(2, 2, 1).why, "") << "GPU workers";
  EngineConfig c;
  const std::string measured = apply_auto_knobs(c, {2, 1, 1e9, 0, {kPsMessageSharedCoresS, ""}});
  EXPECT_NE(measured.find("(1200 us per message)"), std::string::npos) << measured;
  EngineConfig d;
  const std::string gpus = apply_auto_knobs(d, {2, 1, 1e9, 0, ps_message_cost(2, 2, 1)});
  EXPECT_NE(gpus.find("(5 us per message)"), std::string::npos) << gpus;
}

TEST(AutoKnobs, WithOneWorkerTheDefaultsStay) {
  for (const ClusterShape shape : {ClusterShape{1, 1}, ClusterShape{1, 0}}) {
    EXPECT_EQ(auto_knobs(shape).knobs.partition_bytes, Knobs{}.partition_bytes);
    EXPECT_EQ(auto_knobs(shape).knobs.credit_bytes, Knobs{}.credit_bytes);
  }
  EngineConfig c;
  EXPECT_TRUE(apply_auto_knobs(c, {1, 0}).empty());
  EXPECT_EQ(c.knobs.small_tensor_bytes, 0u);
}

TEST(AutoKnobs, RingCostIsTwoNMinusOneStepsAndTwoNMinusOneOverNOfTheBytes) {
  const MessageCost c = ring_allreduce_cost(4, 8e9, 1e-6);  // 1 GB/s
  EXPECT_DOUBLE_EQ(c.alpha_s, 6e-6);
  EXPECT_DOUBLE_EQ(c.beta_s_per_byte, 1.5e-9);
  EXPECT_EQ(ring_allreduce_cost(1, 8e9, 1e-6).alpha_s, 0);
}

// The all-reduce partition is the smallest power of two whose latency is at most 1/64 of its bytes' time, within
// [4 MiB, 1 GiB]: it grows with the workers and the link rate. One batch in flight; fusion up to one partition, at
// least two of the smallest (8 MiB): the 1/32 rule's bound of two of its partitions, its large tensors cut half as
// finely (bench/RESULTS.md, session 24).
TEST(AutoKnobs, AllReducePartitionsAmortiseTheRingLatency) {
  uint64_t previous = 0;
  for (int workers : {2, 8, 16, 64, 256, 1024}) {
    for (double bps : {1e9, 10e9, 100e9}) {
      const ClusterShape shape{workers, 0, bps, 5e-6};
      const AutoKnobs k = auto_knobs(shape);
      const uint64_t p = k.knobs.partition_bytes;
      const MessageCost cost = ring_allreduce_cost(workers, bps, 5e-6);
      SCOPED_TRACE(std::to_string(workers) + " workers, " + std::to_string(bps / 1e9) + " Gbit/s");
      EXPECT_TRUE(std::has_single_bit(p));
      EXPECT_GE(p, 4 * MiB);
      EXPECT_LE(p, 1024 * MiB);
      if (p < 1024 * MiB) {
        EXPECT_LE(64 * cost.alpha_s, cost.beta_s_per_byte * double(p) * (1 + 1e-12));
      }
      if (p > 4 * MiB) {
        EXPECT_GT(64 * cost.alpha_s, cost.beta_s_per_byte * double(p / 2)) << "not the smallest";
      }
      EXPECT_EQ(k.knobs.credit_bytes, 1u) << "one batch in flight";
      EXPECT_EQ(k.knobs.small_tensor_bytes, std::max(p, 8 * MiB)) << "tensors fused up to a partition, 8 MiB at least";
      // The fusion bound is the one the 1/32 rule gave (two of its partitions): only the partitions changed.
      const uint64_t at_1_32 =
          std::clamp(std::bit_ceil(uint64_t(std::ceil(32 * cost.alpha_s / cost.beta_s_per_byte))), 4 * MiB, 1024 * MiB);
      EXPECT_EQ(k.knobs.small_tensor_bytes, std::min(2 * at_1_32, 1024 * MiB));
    }
    const uint64_t at_10g = auto_knobs({workers, 0, 10e9, 5e-6}).knobs.partition_bytes;
    EXPECT_GE(at_10g, previous);
    previous = at_10g;
  }
  // The numbers the rule gives (64 * n * latency * rate = 102.4 MB at 256 workers, 10 Gbit/s).
  EXPECT_EQ(auto_knobs({256, 0, 10e9, 5e-6}).knobs.partition_bytes, 128 * MiB);
  EXPECT_EQ(auto_knobs({256, 0, 100e9, 5e-6}).knobs.partition_bytes, 1024 * MiB);
  EXPECT_EQ(auto_knobs({64, 0, 25e9, 5e-6}).knobs.partition_bytes, 64 * MiB);
  EXPECT_EQ(auto_knobs({8, 0, 10e9, 5e-6}).knobs.partition_bytes, 4 * MiB);
  EXPECT_EQ(auto_knobs({8, 0, 10e9, 5e-6}).knobs.small_tensor_bytes, 8 * MiB);
  // An unknown link is assumed at 10 Gbit/s and 5 us per step.
  EXPECT_EQ(auto_knobs({256, 0}).knobs.partition_bytes, 128 * MiB);
}

TEST(AutoKnobs, ExplicitKnobsAreKeptAndAnExplicitPartitionGetsItsCredit) {
  EngineConfig both;
  both.set("partition_bytes", "1KiB");
  both.set("credit_bytes", "4KiB");
  EXPECT_TRUE(apply_auto_knobs(both, {16, 16}).empty());
  EXPECT_EQ(both.knobs.partition_bytes, 1 * KiB);
  EXPECT_EQ(both.knobs.credit_bytes, 4 * KiB);

  EngineConfig part;
  part.set("partition_bytes", "1MiB");
  const std::string why = apply_auto_knobs(part, {16, 16});
  EXPECT_EQ(part.knobs.partition_bytes, 1 * MiB);
  EXPECT_EQ(part.knobs.credit_bytes, 17 * MiB) << "2 x 17 partitions is above the 16 MiB cap: one round of them";
  EXPECT_NE(why.find("partition 1 MiB (set)"), std::string::npos) << why;
  EXPECT_NE(why.find("credit 17 MiB (17x) (automatic"), std::string::npos) << why;

  EngineConfig none;
  const std::string auto_why = apply_auto_knobs(none, {16, 4});
  EXPECT_EQ(none.knobs.partition_bytes, 256 * KiB);  // fan-in 4 at the assumed 10 Gbit/s
  EXPECT_EQ(none.knobs.credit_bytes, 34 * 256 * KiB);
  EXPECT_NE(auto_why.find("16 workers x 4 servers (5 us per message, link assumed 10 Gbit/s)"), std::string::npos)
      << auto_why;
  EXPECT_NE(auto_why.find("partition 256 KiB (automatic: incast against per-message cost)"), std::string::npos)
      << auto_why;
}

TEST(AutoKnobs, AllReduceKeepsWhatWasSet) {
  EngineConfig none;
  const std::string why = apply_auto_knobs(none, {256, 0, 10e9, 5e-6});
  EXPECT_EQ(none.knobs.partition_bytes, 128 * MiB);
  EXPECT_EQ(none.knobs.credit_bytes, 1u);
  EXPECT_EQ(none.knobs.small_tensor_bytes, 128 * MiB);
  EXPECT_NE(why.find("256-worker all-reduce"), std::string::npos) << why;
  EXPECT_NE(why.find("partition 128 MiB (automatic: ring latency at most 1/64 of its bytes' time), credit one batch in "
                     "flight (automatic"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("fused up to 128 MiB (automatic: one partition, at least 8 MiB"), std::string::npos) << why;

  EngineConfig part;  // an explicit partition: the fusion bound follows it
  part.set("partition_bytes", "16MiB");
  apply_auto_knobs(part, {256, 0, 10e9, 5e-6});
  EXPECT_EQ(part.knobs.partition_bytes, 16 * MiB);
  EXPECT_EQ(part.knobs.credit_bytes, 1u);
  EXPECT_EQ(part.knobs.small_tensor_bytes, 16 * MiB);

  EngineConfig small;  // below two of the smallest automatic partitions the fusion bound stays at 8 MiB
  small.set("partition_bytes", "1MiB");
  apply_auto_knobs(small, {256, 0, 10e9, 5e-6});
  EXPECT_EQ(small.knobs.small_tensor_bytes, 8 * MiB);

  EngineConfig all;
  all.set("partition_bytes", "1MiB");
  all.set("credit_bytes", "3MiB");
  all.set("small_tensor_bytes", "128KiB");
  EXPECT_TRUE(apply_auto_knobs(all, {256, 0}).empty());
  EXPECT_EQ(all.knobs.partition_bytes, 1 * MiB);
  EXPECT_EQ(all.knobs.credit_bytes, 3 * MiB);
  EXPECT_EQ(all.knobs.small_tensor_bytes, 128 * KiB);
}

}  // namespace
}  // namespace commsched
