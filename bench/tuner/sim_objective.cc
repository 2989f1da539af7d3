#include "bench/tuner/sim_objective.h"

#include <cmath>

#include "simulator/sim_policy.h"
#include "simulator/simulator.h"
#include "scheduler/config.h"

namespace commsched::tuner::bench {

SimObjective::SimObjective(sim::ModelProfile model, double bandwidth_bps, int workers)
    : model_(std::move(model)),
      network_(std::make_unique<sim::PsNetwork>(sim::PsParams{workers, workers, bandwidth_bps, bandwidth_bps, 25e-6})) {}

double SimObjective::iteration_s(const Knobs& k) {
  const auto key = std::make_pair(k.partition_bytes, k.credit_bytes);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  EngineConfig config;
  config.policy = PolicyKind::bytescheduler;
  config.knobs = k;
  auto policy = sim::make_sim_policy(config, *network_);
  sim::SimOptions options;
  options.partition_bytes = k.partition_bytes;
  const double t = sim::simulate(model_, *network_, *policy, options).iteration_s;
  cache_.emplace(key, t);
  return t;
}

SimulatedTraining::SimulatedTraining(SimObjective& objective, Knobs start, double noise_sd, uint64_t seed)
    : objective_(objective), active_(start), rng_(seed), noise_(0.0, noise_sd) {}

double SimulatedTraining::run_iteration() {
  bool switched = false;
  if (pending_) {
    switched = pending_->partition_bytes != active_.partition_bytes || pending_->credit_bytes != active_.credit_bytes;
    active_ = *pending_;
    pending_.reset();
  }
  return objective_.iteration_s(active_) * (switched ? 1.5 : 1.0) * std::exp(noise_(rng_));
}

double SimulatedTraining::noisy_iteration_s(const Knobs& k) { return objective_.iteration_s(k) * std::exp(noise_(rng_)); }

}  // namespace commsched::tuner::bench
