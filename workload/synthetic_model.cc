#include "workload/synthetic_model.h"

#include "base/half.h"
#include "base/stats.h"
#include "scheduler/completion_waiter.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

namespace commsched {
namespace {

using Clock = std::chrono::steady_clock;

// Element k of a buffer of `dtype`, as a double (exact for the small integers the data check uses).
double load_value(DType dtype, const std::byte* b, size_t k) {
  switch (dtype) {
    case DType::f32: { float v; std::memcpy(&v, b + 4 * k, 4); return v; }
    case DType::f64: { double v; std::memcpy(&v, b + 8 * k, 8); return v; }
    case DType::i32: { int32_t v; std::memcpy(&v, b + 4 * k, 4); return v; }
    case DType::i64: { int64_t v; std::memcpy(&v, b + 8 * k, 8); return static_cast<double>(v); }
    case DType::f16: { uint16_t v; std::memcpy(&v, b + 2 * k, 2); return f16_to_f32(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, b + 2 * k, 2); return bf16_to_f32(v); }
  }
  return 0;
}

void store_value(DType dtype, std::byte* b, size_t k, double x) {
  switch (dtype) {
    case DType::f32: { const float v = static_cast<float>(x); std::memcpy(b + 4 * k, &v, 4); return; }
    case DType::f64: { std::memcpy(b + 8 * k, &x, 8); return; }
    case DType::i32: { const int32_t v = static_cast<int32_t>(x); std::memcpy(b + 4 * k, &v, 4); return; }
    case DType::i64: { const int64_t v = static_cast<int64_t>(x); std::memcpy(b + 8 * k, &v, 8); return; }
    case DType::f16: { const uint16_t v = f32_to_f16(static_cast<float>(x)); std::memcpy(b + 2 * k, &v, 2); return; }
    case DType::bf16: { const uint16_t v = f32_to_bf16(static_cast<float>(x)); std::memcpy(b + 2 * k, &v, 2); return; }
  }
}

}  // namespace

SyntheticResult run_synthetic_model(Engine& engine, const sim::ModelProfile& profile, const SyntheticOptions& opts) {
  const int rank = engine.backend().rank();
  const int size = engine.backend().size();
  WaitHelper* const helper = engine.wait_helper().helper;  // the engine (and its backend) outlive this call
  const size_t n = profile.tensors.size();
  std::vector<std::vector<std::byte>> buffers(n);
  for (size_t i = 0; i < n; ++i) buffers[i].resize(profile.tensors[i].bytes());
  // One waiter per tensor: the forward pass of a layer waits for its own tensors' previous reductions only.
  const auto completions = std::make_unique<CompletionWaiter[]>(n);
  SyntheticResult result;
  result.bytes_per_iteration = profile.total_bytes();
  result.compute_s = static_cast<double>(profile.compute_per_iteration()) * 1e-9 * opts.compute_scale;

  // What the data check covers: in the warm-up iterations and the trailing unmeasured one, EVERY element of every
  // tensor of every dtype is set (rank+1; 1 for f16/bf16, whose sums of ranks stop being exact integers sooner) and
  // checked against the exact sum, so measured time is not spent filling buffers. In measured iterations only the first
  // element of every tensor (a marker) is set and checked.
  const int last_it_guess = opts.warmup + opts.iterations;  // the trailing iteration when no tuning phase runs
  std::vector<char> full(n, 0);  // the last fill of tensor i covered every element
  auto set_data = [&](size_t i, bool every) {
    const sim::TensorProfile& t = profile.tensors[i];
    const size_t count = every ? t.elements : std::min<uint64_t>(t.elements, 1);
    const bool half = t.dtype == DType::f16 || t.dtype == DType::bf16;
    const double v = half ? 1.0 : static_cast<double>(rank + 1);
    std::byte* b = buffers[i].data();
    for (size_t k = 0; k < count; ++k) store_value(t.dtype, b, k, v);
    full[i] = every;
  };
  auto check_data = [&](size_t i) {
    const sim::TensorProfile& t = profile.tensors[i];
    if (buffers[i].empty() || opts.op == Op::broadcast) return;
    const bool half = t.dtype == DType::f16 || t.dtype == DType::bf16;
    const double expect = half ? static_cast<double>(size) : static_cast<double>(size) * (size + 1) / 2;
    const size_t count = full[i] ? t.elements : 1;
    for (size_t k = 0; k < count; ++k)
      if (load_value(t.dtype, buffers[i].data(), k) != expect) {
        result.data_ok = false;
        if (result.error.empty())
          result.error = "tensor '" + t.name + "' element " + std::to_string(k) + " is " +
                         std::to_string(load_value(t.dtype, buffers[i].data(), k)) + ", expected " +
                         std::to_string(expect);
        return;
      }
    if (full[i]) ++result.tensors_fully_checked;
  };

  Clock::time_point deadline = Clock::now();
  auto compute = [&](Nanos ns) {
    deadline += std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(ns) * opts.compute_scale));
    std::this_thread::sleep_until(deadline);
  };

  // Iterations [0, warmup) warm up, then the tuning phase (if any) runs until the tuner is done, then `iterations`
  // are measured from `measured_from` on.
  int measured_from = opts.warmup;
  bool tuning = static_cast<bool>(opts.tuning_step);
  std::vector<Clock::time_point> starts;
  // One trailing iteration is run but not measured: an iteration ends when the next one starts, and the last one
  // would otherwise end with the final drain (every gradient reduced), which a training loop overlaps with the next
  // forward pass.
  for (int it = 0; it < measured_from + opts.iterations + 1; ++it) {
    starts.push_back(Clock::now());
    if (tuning && it > opts.warmup) {
      const double last = std::chrono::duration<double>(starts[it] - starts[it - 1]).count();
      tuning = opts.tuning_step(last) && result.tuning_iterations < opts.max_tuning_iterations;
      ++result.tuning_iterations;
      // The final knobs apply from this iteration's backward_done on: skip one more iteration before measuring.
      if (!tuning) measured_from = it + 2;
    }
    if (tuning) measured_from = it + 1;
    // Forward: layer l needs its parameters updated, i.e. its gradients of the previous iteration reduced.
    for (const auto& layer : profile.layers) {
      if (it > 0) {
        bool waited = false;
        for (size_t ti : layer.tensors) {
          // As a training loop waiting in synchronize() does: the waiting thread runs the backend's work meanwhile.
          if (const Status st = completions[ti].wait(opts.completion_limit, 0, helper); !st.ok()) {
            result.error = "tensor '" + profile.tensors[ti].name + "' of iteration " + std::to_string(it - 1) + ": " +
                           st.message;
            engine.wait_all_for(opts.completion_limit);  // the rest still write into the buffers
            return result;
          }
          completions[ti].reset();
          check_data(ti);
          waited = true;
        }
        if (waited) deadline = std::max(deadline, Clock::now());
      }
      compute(layer.forward);
    }
    // Backward: last layer first; each layer's gradients go to the engine as soon as they exist.
    for (auto l = profile.layers.rbegin(); l != profile.layers.rend(); ++l) {
      compute(l->backward);
      for (size_t ti : l->tensors) {
        set_data(ti, it < opts.warmup || it == std::max(last_it_guess, measured_from + opts.iterations));
        Task t;
        t.name = profile.tensors[ti].name;
        t.priority = static_cast<int32_t>(ti);
        t.op = opts.op;
        t.dtype = profile.tensors[ti].dtype;
        t.count = profile.tensors[ti].elements;
        t.buffer.data = buffers[ti].data();
        t.on_done = completions[ti].callback();
        engine.submit(std::move(t));
      }
    }
    engine.backward_done();
  }
  engine.wait_all();
  starts.push_back(Clock::now());
  for (size_t i = 0; i < n; ++i) check_data(i);
  for (size_t i = 0; i < n && result.error.empty(); ++i)
    if (const auto failed = completions[i].failures(); !failed.empty())
      result.error = "tensor '" + profile.tensors[i].name + "': " + failed.front().message;

  for (int it = measured_from; it < measured_from + opts.iterations; ++it)
    result.iteration_s.push_back(std::chrono::duration<double>(starts[it + 1] - starts[it]).count());
  const auto& v = result.iteration_s;
  if (!v.empty()) {
    const MeanCi m = mean_ci95(v);
    result.mean_s = m.mean;
    result.ci95_s = m.half_width;
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    result.median_s = sorted[sorted.size() / 2];
  }
  return result;
}

}  // namespace commsched
