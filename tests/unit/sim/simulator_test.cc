#include "simulator/simulator.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "simulator/sim_policy.h"
#include "scheduler/fifo_policy.h"
#include "scheduler/policy_factory.h"
#include "scheduler/priority_credit_policy.h"
#include "tests/unit/sim/sim_test_util.h"

namespace commsched::sim {
namespace {

using testing::kMs;

SimResult run(const ModelProfile& m, NetworkModel& net, PolicyKind kind, uint64_t partition = 4 << 20,
              uint64_t credit = 4 << 20, bool timeline = false) {
  EngineConfig c;
  c.policy = kind;
  c.knobs = {partition, credit};
  auto policy = make_sim_policy(c, net);
  SimOptions o;
  o.partition_bytes = partition;
  o.record_timeline = timeline;
  return simulate(m, net, *policy, o);
}

TEST(Simulator, OneTensorOnARingTakesComputePlusOneAllreduce) {
  const auto m = testing::one_tensor(8'000'000, 2 * kMs, 4 * kMs);
  RingAllreduceNetwork net({4, 8e9, 1e-6});  // 1 byte/ns
  FifoPolicy wfbp;
  const SimResult r = simulate(m, net, wfbp, SimOptions{});
  // Nothing overlaps: forward, backward, then 1.5 * 8 ms + 6 us of all-reduce before the next forward may start.
  EXPECT_NEAR(r.iteration_s, 6e-3 + 12e-3 + 6e-6, 1e-9);
  EXPECT_NEAR(r.compute_s, 6e-3, 1e-12);
  // The bounds count the one collective every iteration needs (its 6 us alpha, less half a nanosecond of rounding).
  EXPECT_NEAR(r.lower_bound_s, 12e-3 + 6e-6 - 0.5e-9, 1e-12);
  // One tensor, needed first and produced last: this schedule is the bound.
  EXPECT_NEAR(r.dependency_bound_s, 18e-3 + 6e-6 - 0.5e-9, 1e-12);
  ASSERT_EQ(r.iteration_start_s.size(), 7u);
  EXPECT_DOUBLE_EQ(r.iteration_start_s[0], 0.0);
}

TEST(Simulator, OneTensorOverThePsTakesComputePlusPushAndPull) {
  const auto m = testing::one_tensor(1'250'000, kMs, 2 * kMs);
  PsNetwork even({8, 8, 10e9, 10e9, 20e-6, 0, false});  // idealised: the tensor spread over the 8 servers
  FifoPolicy wfbp;
  EXPECT_NEAR(simulate(m, even, wfbp, SimOptions{}).iteration_s, 3e-3 + 2 * (1e-3 + 20e-6), 1e-9);
  // As the PS shards it: the one key lives on one server, which receives it from all 8 workers and sends 8 sums.
  PsNetwork sharded({8, 8, 10e9, 10e9, 20e-6, 0, true});
  FifoPolicy wfbp2;
  EXPECT_NEAR(simulate(m, sharded, wfbp2, SimOptions{}).iteration_s, 3e-3 + 2 * (8e-3 + 20e-6), 1e-9);
}

// The engine releases credit when the PS acknowledges receipt of a push (scheduler/engine.cc, on_batch_sent), not when
// the sum is back; the simulator must do the same or it mispredicts credit-limited scheduling.
TEST(Simulator, PsCreditIsReleasedWhenThePushHasArrived) {
  const auto m = testing::one_tensor(4000, 0, kMs);  // one tensor, 4 partitions of 1000 bytes
  PsNetwork net({1, 1, 8e9, 8e9, 0});                 // 1 byte per ns, no latency
  const SimResult r = run(m, net, PolicyKind::bytescheduler, 1000, 1000, true);
  std::vector<Nanos> starts;
  for (const Span& s : r.spans)
    if (s.lane == Span::Lane::comm && s.iteration == 0) starts.push_back(s.start);
  std::sort(starts.begin(), starts.end());
  ASSERT_EQ(starts.size(), 4u);
  // One partition of credit: each push starts as the previous one has arrived (1000 ns), not after its pull (2000 ns).
  for (size_t i = 1; i < starts.size(); ++i) EXPECT_EQ(starts[i] - starts[i - 1], 1000) << i;
}

TEST(Simulator, NoPolicyBeatsTheLowerBound) {
  const auto m = testing::vgg_like();
  const std::vector<PolicyKind> kinds = all_policies();  // every registered policy
  for (double bw : {1e9, 10e9, 100e9})
    for (PolicyKind k : kinds) {
      PsNetwork ps({8, 8, bw, bw, 25e-6});
      RingAllreduceNetwork ring({8, bw, 5e-6});
      for (NetworkModel* net : {static_cast<NetworkModel*>(&ps), static_cast<NetworkModel*>(&ring)}) {
        const SimResult r = run(m, *net, k, 1 << 20, 4 << 20);
        EXPECT_GE(r.dependency_bound_s, r.lower_bound_s);
        EXPECT_GE(r.iteration_s, r.dependency_bound_s * (1 - 1e-9)) << policy_name(k) << " " << net->describe();
      }
    }
}

// Transformer's shared embedding is needed first and produced last: the bound that knows it is above the simple one,
// and still no policy beats it.
TEST(Simulator, DependencyBoundHoldsOnTheRealTransformerProfile) {
  const auto m = load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/transformer-base.json");
  PsNetwork net({8, 8, 10e9, 10e9, 25e-6});
  EXPECT_GT(dependency_bound_s(m, net), 1.1 * std::max(m.compute_per_iteration() * 1e-9,
                                                       comm_bound_s(m, m.layers.size(), net)));
  for (PolicyKind k : {PolicyKind::bytescheduler, PolicyKind::wfbp, PolicyKind::mgwfbp}) {
    const SimResult r = run(m, net, k, 1 << 20, 2 << 20);
    EXPECT_GE(r.iteration_s, r.dependency_bound_s * (1 - 1e-9)) << policy_name(k);
  }
}

TEST(Simulator, PriorityBeatsFifoOnVggLikeModelAtLowBandwidth) {
  const auto m = testing::vgg_like();
  PsNetwork net({8, 8, 10e9, 10e9, 25e-6});
  const SimResult fifo = run(m, net, PolicyKind::wfbp);
  const SimResult prio = run(m, net, PolicyKind::bytescheduler, 1 << 20, 2 << 20);
  EXPECT_LT(prio.iteration_s, 0.9 * fifo.iteration_s) << "fifo " << fifo.iteration_s << " prio " << prio.iteration_s;
  EXPECT_GT(prio.batches, fifo.batches) << "partitioning should produce more messages";
}

TEST(Simulator, BspCommunicatesOnlyAfterBackward) {
  const auto m = testing::vgg_like();
  RingAllreduceNetwork net({8, 10e9, 0});
  const SimResult bsp = run(m, net, PolicyKind::bsp, 4 << 20, 4 << 20, /*timeline=*/true);
  std::vector<Nanos> backward_end(6, 0);
  for (const Span& s : bsp.spans)
    if (s.lane == Span::Lane::backward) backward_end[s.iteration] = std::max(backward_end[s.iteration], s.end);
  size_t comm = 0;
  for (const Span& s : bsp.spans)
    if (s.lane == Span::Lane::comm) {
      EXPECT_GE(s.start, backward_end[s.iteration]) << "iteration " << s.iteration;
      ++comm;
    }
  EXPECT_EQ(comm, 6 * m.tensors.size());
  // Only the next forward overlaps the communication (layer 0's tensors go first), never backward.
  EXPECT_LE(bsp.iteration_s, bsp.compute_s + bsp.comm_bound_s + 1e-6);
}

TEST(Simulator, MgWfbpMergesWhenLatencyDominates) {
  const auto m = testing::vgg_like();
  RingAllreduceNetwork net({64, 100e9, 200e-6});  // 25 ms per message
  const SimResult mg = run(m, net, PolicyKind::mgwfbp);
  const SimResult wfbp = run(m, net, PolicyKind::wfbp);
  EXPECT_LT(mg.batches, wfbp.batches);
  EXPECT_LT(mg.iteration_s, wfbp.iteration_s);
}

TEST(Simulator, FusionSendsFewerMessagesThanTensors) {
  const auto m = testing::vgg_like();
  PsNetwork net({8, 8, 10e9, 10e9, 25e-6});
  const SimResult fusion = run(m, net, PolicyKind::fusion);
  const SimResult wfbp = run(m, net, PolicyKind::wfbp);
  EXPECT_LT(fusion.batches, wfbp.batches);
}

TEST(Simulator, IsDeterministic) {
  const auto m = testing::vgg_like();
  PsNetwork net({8, 8, 5e9, 5e9, 25e-6});
  const SimResult a = run(m, net, PolicyKind::bytescheduler, 1 << 20, 2 << 20);
  const SimResult b = run(m, net, PolicyKind::bytescheduler, 1 << 20, 2 << 20);
  EXPECT_EQ(a.iteration_start_s, b.iteration_start_s);
  EXPECT_EQ(a.batches, b.batches);
}

TEST(Simulator, RecordsSpansOfEveryLane) {
  const auto m = testing::vgg_like();
  PsNetwork net({8, 8, 10e9, 10e9, 25e-6});
  const SimResult r = run(m, net, PolicyKind::bytescheduler, 1 << 20, 2 << 20, /*timeline=*/true);
  size_t comm = 0, fwd = 0, bwd = 0;
  for (const Span& s : r.spans) {
    EXPECT_LE(s.start, s.end);
    comm += s.lane == Span::Lane::comm;
    fwd += s.lane == Span::Lane::forward;
    bwd += s.lane == Span::Lane::backward;
  }
  EXPECT_EQ(fwd, 6 * m.layers.size());
  EXPECT_EQ(bwd, 6 * m.layers.size());
  EXPECT_EQ(comm, r.batches);
}

TEST(Simulator, ManyWorkersCostTheSameToSimulate) {
  // The representative-worker model: 256 workers is a parameter, not 256 simulated processes.
  const auto m = testing::vgg_like();
  PsNetwork net({256, 256, 25e9, 25e9, 25e-6});
  const SimResult r = run(m, net, PolicyKind::bytescheduler, 1 << 20, 4 << 20);
  EXPECT_GE(r.iteration_s, r.lower_bound_s);
}

TEST(Simulator, RejectsBadOptions) {
  const auto m = testing::one_tensor(4, 1, 1);
  RingAllreduceNetwork net({2, 1e9, 0});
  FifoPolicy p;
  SimOptions o;
  o.warmup = o.iterations;
  EXPECT_THROW(simulate(m, net, p, o), InvalidArgument);
}

}  // namespace
}  // namespace commsched::sim
