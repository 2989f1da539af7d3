// The emulated training loop: runs a model profile through an Engine as a training loop would: forward layer by layer
// (each layer first waits for its own gradients of the previous iteration: where priority scheduling pays), then
// backward last layer first, submitting each layer's gradients as they are produced. Compute is emulated by sleeping
// for the profiled times. The one copy: `commsched run`, its parameter-server workers and engine_bench run it on the
// engine a Context composed.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "scheduler/engine.h"
#include "workload/profile.h"

namespace commsched {

struct SyntheticOptions {
  int iterations = 20;        // measured iterations
  int warmup = 3;             // dropped from the statistics
  double compute_scale = 1.0; // multiplies every forward/backward time
  Op op = Op::push_pull;
  // Auto-tuning phase between warm-up and measurement: called at each iteration boundary with the wall time of the
  // iteration just ended; iterations go on unmeasured while it returns true (at most max_tuning_iterations).
  std::function<bool(double seconds)> tuning_step;
  int max_tuning_iterations = 1000;
  // How long a layer's forward waits for its gradients' previous reduction before the run stops with an error naming
  // the tensor (the backend fails a lost peer's tasks well within it; this only keeps a bug from hanging the loop).
  std::chrono::nanoseconds completion_limit = std::chrono::minutes(5);
};

struct SyntheticResult {
  std::vector<double> iteration_s;  // measured iterations only
  double mean_s = 0;
  double ci95_s = 0;                // half-width of the 95% interval of the mean (Student t, base/stats.h)
  double median_s = 0;
  uint64_t bytes_per_iteration = 0;
  double compute_s = 0;             // emulated compute per iteration
  int tuning_iterations = 0;        // iterations spent in the tuning phase
  bool data_ok = true;              // every checked element held the exact sum (see tensors_fully_checked)
  // Tensor reductions whose EVERY element was checked (warm-up and trailing iterations); in measured iterations only
  // the first element of each tensor is.
  uint64_t tensors_fully_checked = 0;
  std::string error;                // first task error, if any
};

SyntheticResult run_synthetic_model(Engine& engine, const sim::ModelProfile& profile, const SyntheticOptions& opts);

}  // namespace commsched
