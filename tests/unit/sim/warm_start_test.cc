// The simulated warm start for the online tuner (simulator/warm_start.h).
#include "simulator/warm_start.h"

#include <gtest/gtest.h>

#include "scheduler/policy_factory.h"
#include "simulator/sim_policy.h"
#include "simulator/simulator.h"

namespace commsched::sim {
namespace {

ModelProfile profile(const std::string& name) {
  return load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/" + name + ".json");
}

double predicted_s(const ModelProfile& m, const WarmStartJob& job, const Knobs& k) {
  GridSpec spec;
  spec.network = job.network;
  spec.ring_alpha_s = job.latency_s;
  spec.sim.iterations = 8;
  spec.sim.warmup = 2;
  EngineConfig c;
  c.knobs = k;
  auto net = make_network(spec, job.link_bps, job.workers);
  SimOptions o = spec.sim;
  o.partition_bytes = k.partition_bytes;
  return simulate(m, *net, *make_sim_policy(c, *net), o).iteration_s;
}

TEST(WarmStart, RanksTheTunersReachableKnobsByPredictedTime) {
  const ModelProfile m = profile("resnet50");
  WarmStartJob job;
  job.network = NetworkKind::allreduce;
  job.workers = 64;
  job.link_bps = 10e9;
  job.latency_s = 5e-6;
  const std::vector<Knobs> knobs = simulated_warm_start(m, job, 3);
  ASSERT_EQ(knobs.size(), 3u);
  double previous = 0;
  for (size_t i = 0; i < knobs.size(); ++i) {
    EXPECT_TRUE(knobs[i].credit_bytes >= knobs[i].partition_bytes || knobs[i].credit_bytes == 1)
        << "the tuner's credit is one batch in flight or at least one partition";
    for (size_t j = 0; j < i; ++j)
      EXPECT_FALSE(knobs[i].partition_bytes == knobs[j].partition_bytes && knobs[i].credit_bytes == knobs[j].credit_bytes);
    const double t = predicted_s(m, job, knobs[i]);
    EXPECT_GE(t, previous) << "fastest first";
    previous = t;
  }
  // The first is better than the fixed defaults, which pay 2(W-1) latencies per 4 MiB.
  EXPECT_LT(predicted_s(m, job, knobs[0]), predicted_s(m, job, Knobs{}));
}

TEST(WarmStart, ThePlanCarriesPredictionsAndTheCurrentKnobs) {
  const ModelProfile m = profile("resnet50");
  WarmStartJob job;
  job.network = NetworkKind::allreduce;
  job.workers = 64;
  job.base.knobs = Knobs{};  // the fixed defaults: 4 MiB, 16 MiB
  const WarmStartPlan plan = plan_warm_start(m, job, 3);
  ASSERT_EQ(plan.ranked.size(), 3u);
  for (size_t i = 0; i < plan.ranked.size(); ++i) {
    EXPECT_NEAR(plan.ranked[i].predicted_s, predicted_s(m, job, plan.ranked[i].knobs), 1e-9);
    if (i > 0) {
      EXPECT_GE(plan.ranked[i].predicted_s, plan.ranked[i - 1].predicted_s);
    }
  }
  EXPECT_EQ(plan.current.knobs, Knobs{});
  EXPECT_NEAR(plan.current.predicted_s, predicted_s(m, job, Knobs{}), 1e-9);
  EXPECT_LT(plan.ranked.front().predicted_s, plan.current.predicted_s);
}

// The fusion bound is a knob the warm start chooses: its candidates carry bounds the tuner can reach (off, or within
// the registered range), and ResNet-50's many small tensors on a 64-worker ring pay 2(W-1) latencies each unless
// fused, so the best candidate fuses although the job starts with fusion off.
TEST(WarmStart, ChoosesTheFusionBoundToo) {
  const ModelProfile m = profile("resnet50");
  WarmStartJob job;
  job.network = NetworkKind::allreduce;
  job.workers = 64;
  job.link_bps = 10e9;
  job.latency_s = 5e-6;
  job.base.knobs.small_tensor_bytes = 0;
  const WarmStartPlan plan = plan_warm_start(m, job, 4);
  ASSERT_FALSE(plan.ranked.empty());
  const KnobTuning& t = registered_tuning("small_tensor_bytes");
  for (const WarmStartCandidate& c : plan.ranked) {
    const uint64_t f = c.knobs.small_tensor_bytes;
    EXPECT_TRUE(f == 0 || (double(f) >= t.min && double(f) <= t.max)) << f;
  }
  EXPECT_NE(plan.ranked.front().knobs.small_tensor_bytes, 0u) << "fusing pays on a latency-bound ring";
  EXPECT_EQ(plan.current.knobs.small_tensor_bytes, 0u) << "the job's own knobs, simulated as they are";
}

// The tuner's own bounds (COMMSCHED_TUNER_*) bound the candidates too: a knob it would clamp is not predicted.
TEST(WarmStart, KeepsToTheTunersBounds) {
  const ModelProfile m = profile("resnet50");
  WarmStartJob job;
  job.network = NetworkKind::allreduce;
  job.workers = 64;
  job.link_bps = 10e9;
  job.latency_s = 5e-6;
  job.base.knobs = Knobs{4ull << 20, 1, 0};
  const WarmStartPlan free = plan_warm_start(m, job, 4);
  ASSERT_FALSE(free.ranked.empty());
  ASSERT_GT(free.ranked.front().knobs.small_tensor_bytes, 2ull << 20) << "unbounded, it fuses more than 2 MiB";
  job.bounds["small_tensor_bytes"].min = 64ull << 10;
  job.bounds["small_tensor_bytes"].max = 2ull << 20;
  job.bounds["partition_bytes"].max = 16ull << 20;
  job.bounds["credit_bytes"].max = 1;
  const WarmStartPlan bounded = plan_warm_start(m, job, 4);
  ASSERT_FALSE(bounded.ranked.empty());
  for (const WarmStartCandidate& c : bounded.ranked) {
    const Knobs& k = c.knobs;
    EXPECT_TRUE(k.small_tensor_bytes == 0 || (k.small_tensor_bytes >= 64ull << 10 && k.small_tensor_bytes <= 2ull << 20))
        << k.small_tensor_bytes;
    EXPECT_LE(k.partition_bytes, 16ull << 20);
    EXPECT_TRUE(k.credit_bytes == 1 || k.credit_bytes == k.partition_bytes) << k.credit_bytes;
  }
}

// Backward runs last layer first: tensor 2's gradient is ready first, then 1 (2 ms later), then 0 (6 ms later).
TEST(MeasuredProfile, BackwardComputeIsTheGapBeforeEachGradient) {
  const std::vector<uint64_t> bytes = {4096, 400, 1 << 20};
  const std::vector<double> ready = {10.008, 10.002, 10.000};
  const ModelProfile p = measured_profile(bytes, ready);
  ASSERT_EQ(p.tensors.size(), 3u);
  EXPECT_EQ(p.tensors[0].elements, 1024u);
  EXPECT_EQ(p.tensors[2].elements, 262144u);
  EXPECT_NEAR(double(p.tensors[0].backward), 6e6, 1e3);
  EXPECT_NEAR(double(p.tensors[1].backward), 2e6, 1e3);
  EXPECT_NEAR(double(p.tensors[2].backward), 6e6, 1e3) << "the first one ready gets the median of the gaps";
  EXPECT_NEAR(double(p.tensors[1].forward), 1e6, 1e3) << "forward: half the backward";
  EXPECT_EQ(p.layers.size(), 3u);
}

TEST(MeasuredProfile, UnseenGradientsGetNoComputeAndBadInputIsNamed) {
  const std::vector<uint64_t> bytes = {4096, 4096};
  const ModelProfile p = measured_profile(bytes, std::vector<double>{-1.0, 0.5});
  EXPECT_EQ(p.tensors[0].backward, 0);
  EXPECT_THROW(measured_profile(bytes, std::vector<double>{0.5}), InvalidArgument);
  EXPECT_THROW(measured_profile(bytes, std::vector<double>{-1.0, -1.0}), InvalidArgument);
}

TEST(WarmStart, RefusesABadJob) {
  const ModelProfile m = profile("resnet50");
  WarmStartJob job;
  job.workers = 0;
  EXPECT_THROW(simulated_warm_start(m, job, 1), InvalidArgument);
  job.workers = 4;
  job.link_bps = 0;
  EXPECT_THROW(simulated_warm_start(m, job, 1), InvalidArgument);
}

}  // namespace
}  // namespace commsched::sim
