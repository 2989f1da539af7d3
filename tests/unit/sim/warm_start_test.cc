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
    EXPECT_GE(knobs[i].credit_bytes, knobs[i].partition_bytes) << "the tuner's credit is at least one partition";
    for (size_t j = 0; j < i; ++j)
      EXPECT_FALSE(knobs[i].partition_bytes == knobs[j].partition_bytes && knobs[i].credit_bytes == knobs[j].credit_bytes);
    const double t = predicted_s(m, job, knobs[i]);
    EXPECT_GE(t, previous) << "fastest first";
    previous = t;
  }
  // The first is better than the fixed defaults, which pay 2(W-1) latencies per 4 MiB.
  EXPECT_LT(predicted_s(m, job, knobs[0]), predicted_s(m, job, Knobs{}));
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
