#include "simulator/warm_start.h"

#include <algorithm>
#include <string>

namespace commsched::sim {
namespace {

// Keeps the grid values of one knob the tuner reaches: within its range, or its axis' bottom band (0: one batch in
// flight, fusion off). When no value within the range is left, the range's ends (a range narrower than the grid).
void keep_reachable(std::vector<double>& values, const KnobTuning& t) {
  const bool band = t.one_batch_band || t.off_band;
  const bool had_band = std::find(values.begin(), values.end(), 0.0) != values.end();
  std::erase_if(values, [&](double v) { return v == 0 ? !band : (v < t.min || v > t.max); });
  if (std::any_of(values.begin(), values.end(), [](double v) { return v != 0; })) return;
  values = {t.min, t.max};
  if (band && had_band) values.insert(values.begin(), 0.0);
}

GridSpec spec_for(const WarmStartJob& job) {
  GridSpec s;
  s.network = job.network;
  s.servers = job.servers;
  if (job.network == NetworkKind::ps) s.latency_s = job.latency_s;
  else s.ring_alpha_s = job.latency_s;
  s.ps_ingress_limited = !job.emulated_links;
  s.base = job.base;
  s.base.policy = PolicyKind::bytescheduler;
  use_default_knob_grid(s);
  for (size_t i = 0; i < kKnobCount; ++i) keep_reachable(s.knob_grid[i], job.bounds.knobs[i]);
  // The job's own fusion bound is a candidate too: on all-reduce it is the automatic one (a partition, at least
  // 8 MiB), which the grid's bounds need not hold.
  std::vector<double>& fusion = s.grid("small_tensor_bytes");
  const double own = double(job.base.knobs.small_tensor_bytes);
  if (std::find(fusion.begin(), fusion.end(), own) == fusion.end()) fusion.push_back(own);
  s.sim.iterations = 8;
  s.sim.warmup = 2;
  return s;
}

void check(const WarmStartJob& job) {
  if (job.workers < 1) throw InvalidArgument("warm start: workers=" + std::to_string(job.workers) + ", expected >= 1");
  if (!(job.link_bps > 0))
    throw InvalidArgument("warm start: link rate " + std::to_string(job.link_bps) + " bit/s, expected > 0");
}

// The job's own knobs, simulated with the same spec (a grid of one point).
WarmStartCandidate simulate_current(const GridSpec& spec, const ModelProfile& model, const WarmStartJob& job) {
  GridSpec one = spec;
  for (size_t i = 0; i < kKnobCount; ++i) one.knob_grid[i] = {knob_grid_value(kKnobs[i], job.base.knobs)};
  const std::vector<CellResult> r = rank_candidates(one, model, job.link_bps, job.workers, PolicyKind::bytescheduler);
  return {job.base.knobs, r.front().iteration_s};
}

}  // namespace

WarmStartPlan plan_warm_start(const ModelProfile& model, const WarmStartJob& job, size_t count) {
  check(job);
  const GridSpec spec = spec_for(job);
  WarmStartPlan plan;
  for (const CellResult& c : rank_candidates(spec, model, job.link_bps, job.workers, PolicyKind::bytescheduler)) {
    if (plan.ranked.size() >= count) break;
    const Knobs& k = c.config.knobs;
    const bool seen = std::any_of(plan.ranked.begin(), plan.ranked.end(),
                                  [&](const WarmStartCandidate& o) { return o.knobs == k; });
    if (!seen) plan.ranked.push_back({k, c.iteration_s});
  }
  plan.current = simulate_current(spec, model, job);
  return plan;
}

std::vector<Knobs> simulated_warm_start(const ModelProfile& model, const WarmStartJob& job, size_t count) {
  std::vector<Knobs> out;
  for (const WarmStartCandidate& c : plan_warm_start(model, job, count).ranked) out.push_back(c.knobs);
  return out;
}

ModelProfile measured_profile(std::span<const uint64_t> tensor_bytes, std::span<const double> ready_s) {
  if (tensor_bytes.size() != ready_s.size())
    throw InvalidArgument("measured profile: " + std::to_string(tensor_bytes.size()) + " tensor sizes but " +
                          std::to_string(ready_s.size()) + " ready times");
  std::vector<size_t> order;  // backward order: the first gradient ready first
  for (size_t i = 0; i < ready_s.size(); ++i)
    if (ready_s[i] >= 0) order.push_back(i);
  if (order.empty()) throw InvalidArgument("measured profile: no gradient was seen becoming ready");
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ready_s[a] < ready_s[b]; });
  std::vector<double> backward(tensor_bytes.size(), 0.0);
  std::vector<double> gaps;
  for (size_t j = 1; j < order.size(); ++j) {
    backward[order[j]] = ready_s[order[j]] - ready_s[order[j - 1]];
    gaps.push_back(backward[order[j]]);
  }
  if (!gaps.empty()) {
    std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
    backward[order.front()] = gaps[gaps.size() / 2];
  }
  std::vector<TensorProfile> tensors;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    TensorProfile t;
    t.name = "tensor." + std::to_string(i);
    t.layer = static_cast<int32_t>(i);
    t.elements = std::max<uint64_t>(1, tensor_bytes[i] / dtype_size(DType::f32));
    t.backward = static_cast<Nanos>(backward[i] * 1e9);
    t.forward = static_cast<Nanos>(backward[i] * kForwardShareOfBackward * 1e9);
    tensors.push_back(std::move(t));
  }
  return make_profile("measured", std::move(tensors));
}

}  // namespace commsched::sim
