#include "simulator/warm_start.h"

#include <algorithm>
#include <string>

namespace commsched::sim {
namespace {

// The job's range of one knob: its own bound where given, else the registered tuning row's.
double bound_or(uint64_t given, double registered) { return given > 0 ? double(given) : registered; }

// Keeps the grid's values within [lo, hi]; when none is, the bounds themselves (a range narrower than the grid).
void keep_within(std::vector<uint64_t>& values, double lo, double hi) {
  std::erase_if(values, [&](uint64_t v) { return double(v) < lo || double(v) > hi; });
  if (values.empty()) values = {uint64_t(lo), uint64_t(hi)};
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
  // Only what the online tuner searches: partitions within its range; one batch in flight (multiplier 0) or a credit
  // of 1x .. its largest multiple of the partition; fusion off (0) or a bound within its range; and the job's own.
  const KnobTuning& partition = registered_tuning("partition_bytes");
  keep_within(s.partitions, bound_or(job.min_partition_bytes, partition.min),
              bound_or(job.max_partition_bytes, partition.max));
  const double max_multiple = job.max_credit_multiple > 0 ? job.max_credit_multiple : registered_tuning("credit_bytes").max;
  std::erase_if(s.credit_multipliers, [&](double k) { return k > 0 && (k < 1 || k > max_multiple); });
  const KnobTuning& fusion = registered_tuning("small_tensor_bytes");
  std::vector<uint64_t> fused(s.small_tensor_bytes.begin(), s.small_tensor_bytes.end());
  std::erase(fused, uint64_t{0});
  keep_within(fused, bound_or(job.min_small_tensor_bytes, fusion.min), bound_or(job.max_small_tensor_bytes, fusion.max));
  s.small_tensor_bytes = {0};
  s.small_tensor_bytes.insert(s.small_tensor_bytes.end(), fused.begin(), fused.end());
  if (std::find(s.small_tensor_bytes.begin(), s.small_tensor_bytes.end(), job.base.knobs.small_tensor_bytes) ==
      s.small_tensor_bytes.end())
    s.small_tensor_bytes.push_back(job.base.knobs.small_tensor_bytes);
  s.sim.iterations = 8;
  s.sim.warmup = 2;
  return s;
}

void check(const WarmStartJob& job) {
  if (job.workers < 1) throw InvalidArgument("warm start: workers=" + std::to_string(job.workers) + ", expected >= 1");
  if (!(job.link_bps > 0))
    throw InvalidArgument("warm start: link rate " + std::to_string(job.link_bps) + " bit/s, expected > 0");
}

// The grid's credit axis is a multiple of the partition (0: one batch in flight); unlimited credit has none.
double credit_multiple(const Knobs& k) {
  if (k.credit_bytes == 0 || k.partition_bytes == 0) return 1e6;  // no limit in practice
  if (k.credit_bytes < k.partition_bytes) return 0;
  return double(k.credit_bytes) / double(k.partition_bytes);
}

// The job's own knobs, simulated with the same spec (a grid of one point).
WarmStartCandidate simulate_current(const GridSpec& spec, const ModelProfile& model, const WarmStartJob& job) {
  GridSpec one = spec;
  one.partitions = {job.base.knobs.partition_bytes};
  one.credit_multipliers = {credit_multiple(job.base.knobs)};
  one.small_tensor_bytes = {job.base.knobs.small_tensor_bytes};
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
