#include "simulator/warm_start.h"

#include <algorithm>

namespace commsched::sim {
namespace {

GridSpec spec_for(const WarmStartJob& job) {
  GridSpec s;
  s.network = job.network;
  s.servers = job.servers;
  if (job.network == NetworkKind::ps) s.latency_s = job.latency_s;
  else s.ring_alpha_s = job.latency_s;
  s.ps_ingress_limited = !job.emulated_links;
  s.base = job.base;
  use_default_knob_grid(s);
  // Only what the online tuner searches: its credit is 1x or more of the partition, and it keeps the fusion bound.
  std::erase_if(s.credit_multipliers, [](double k) { return k < 1; });
  s.small_tensor_bytes = {job.base.small_tensor_bytes};
  s.sim.iterations = 8;
  s.sim.warmup = 2;
  return s;
}

}  // namespace

std::vector<Knobs> simulated_warm_start(const ModelProfile& model, const WarmStartJob& job, size_t count) {
  if (job.workers < 1) throw InvalidArgument("warm start: workers=" + std::to_string(job.workers) + ", expected >= 1");
  if (!(job.link_bps > 0))
    throw InvalidArgument("warm start: link rate " + std::to_string(job.link_bps) + " bit/s, expected > 0");
  const GridSpec spec = spec_for(job);
  std::vector<Knobs> out;
  for (const CellResult& c : rank_candidates(spec, model, job.link_bps, job.workers, PolicyKind::bytescheduler)) {
    if (out.size() >= count) break;
    const Knobs& k = c.config.knobs;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const Knobs& o) {
      return o.partition_bytes == k.partition_bytes && o.credit_bytes == k.credit_bytes;
    });
    if (!seen) out.push_back(k);
  }
  return out;
}

}  // namespace commsched::sim
