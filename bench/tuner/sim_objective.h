// The tuner benchmark's objective: the simulated iteration time of the real ByteScheduler policy (simulator/) for a
// model profile on a parameter-server network, as a KnobControl that an OnlineTuner can drive like the engine.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "simulator/network.h"
#include "workload/profile.h"
#include "scheduler/policy.h"

namespace commsched::tuner::bench {

// Deterministic simulated iteration time per configuration, cached (each configuration is simulated once).
class SimObjective {
 public:
  SimObjective(sim::ModelProfile model, double bandwidth_bps, int workers);
  double iteration_s(const Knobs& k);
  const sim::ModelProfile& model() const { return model_; }

 private:
  sim::ModelProfile model_;
  std::unique_ptr<sim::NetworkModel> network_;
  std::map<std::pair<uint64_t, uint64_t>, double> cache_;
};

// What an iteration of training looks like to the tuner: the simulated time with multiplicative log-normal noise
// (measurement jitter on a real cluster) and a slower first iteration after each switch (the warm-up the tuner drops).
// set_knobs() takes effect at the next iteration, like the engine's iteration boundary.
class SimulatedTraining : public KnobControl {
 public:
  SimulatedTraining(SimObjective& objective, Knobs start, double noise_sd, uint64_t seed);
  Knobs knobs() const override { return active_; }
  void set_knobs(const Knobs& k) override { pending_ = k; }
  double run_iteration();
  // One noisy measurement of a configuration (for the baselines, which do not run through the online tuner).
  double noisy_iteration_s(const Knobs& k);

 private:
  SimObjective& objective_;
  Knobs active_;
  std::optional<Knobs> pending_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> noise_;
};

}  // namespace commsched::tuner::bench
