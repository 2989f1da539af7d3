// A simulated prior for the online tuner: before tuning starts, the knobs the simulator predicts fastest for this
// job (its profile: gradient sizes and compute per layer; its cluster: shape, link rate, latency), found with the same
// Policy code the engine runs. tuner::OnlineTuner::warm_start() starts from the first and tries the others next, so
// the live search starts where the model of the job says the optimum is, and measurement decides.
//
// The profile is either a model profile (`commsched run`) or one measured in the training process itself
// (measured_profile: the gradient sizes the plugin registered and the times their gradients became ready in a
// step, which is the per-layer backward compute).
#pragma once

#include <cstddef>
#include <span>
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
  // The ranges the tuner searches (its COMMSCHED_TUNER_* bounds; default: the knobs' registered tuning rows).
  // Candidates outside them are not simulated: the tuner would clamp them onto other knobs than the ones predicted.
  tuner::SearchSpaceBounds bounds;
  EngineConfig base;               // the engine's other options (policy: bytescheduler; small-tensor fusion kept)
};

struct WarmStartCandidate {
  Knobs knobs;
  double predicted_s = 0;  // simulated time per iteration
};

struct WarmStartPlan {
  std::vector<WarmStartCandidate> ranked;  // the best distinct candidates, fastest predicted first
  WarmStartCandidate current;              // the knobs the job runs now (job.base.knobs), simulated the same way
};

// The `count` best distinct configurations of the knob grid the online tuner can reach (every knob's grid values
// within its range, and its bottom band: one batch in flight, fusion off; the fusion bound also the job's own),
// fastest predicted first, and the prediction for job.base's own
// knobs. Throws InvalidArgument on a bad job (workers < 1, link rate <= 0).
WarmStartPlan plan_warm_start(const ModelProfile& model, const WarmStartJob& job, size_t count);
// The knobs of plan_warm_start(...).ranked alone.
std::vector<Knobs> simulated_warm_start(const ModelProfile& model, const WarmStartJob& job, size_t count);

// The forward compute assumed per layer, as a share of its measured backward: backward computes the gradients of
// both the inputs and the weights, about twice the forward's work (as the bundled profiles measure: ResNet-50's
// forward is 0.50 of its backward).
inline constexpr double kForwardShareOfBackward = 0.5;

// A profile measured in the training process: tensor i (forward order) has tensor_bytes[i] bytes of f32 gradient;
// ready_s[i] is when its gradient became ready in one backward, in seconds on any clock (negative: not seen). The
// backward compute of a tensor's layer is the time since the gradient ready before it (backward runs last layer
// first); the first one ready gets the median of the others' (its layer's compute began before any clock could see
// it). Throws InvalidArgument when the sizes differ or no gradient was seen.
ModelProfile measured_profile(std::span<const uint64_t> tensor_bytes, std::span<const double> ready_s);

}  // namespace commsched::sim
