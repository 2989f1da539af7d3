// A simulated prior for the online tuner: before the first step, the knobs the simulator predicts fastest for this
// job (its profile: gradient sizes and compute per layer; its cluster: shape, link rate, latency), found with the same
// Policy code the engine runs. tuner::OnlineTuner::warm_start() tries them first, so the live search starts where the
// model of the job says the optimum is, and measurement decides.
#pragma once

#include <cstddef>
#include <vector>

#include "scheduler/policy.h"
#include "simulator/grid.h"
#include "workload/profile.h"

namespace commsched::sim {

struct WarmStartJob {
  NetworkKind network = NetworkKind::ps;
  int workers = 2;
  int servers = 0;                 // PS: 0 means as many as workers
  double link_bps = 10e9;          // per worker (and per server), each direction
  double latency_s = 25e-6;        // PS: one way per message; all-reduce: per ring step
  bool emulated_links = false;     // PS: links EMULATED as COMMSCHED_EMULATE_RATE paces them (senders only)
  EngineConfig base;               // the engine's other options (policy: bytescheduler; small-tensor fusion kept)
};

// The `count` best distinct configurations of the knob grid the online tuner can reach (partition, and credit as 1x
// or more of it), fastest predicted first. Throws InvalidArgument on a bad job (workers < 1, link rate <= 0).
std::vector<Knobs> simulated_warm_start(const ModelProfile& model, const WarmStartJob& job, size_t count);

}  // namespace commsched::sim
