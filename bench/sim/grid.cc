#include "bench/sim/grid.h"

#include <algorithm>
#include <limits>
#include <map>

#include "bench/sim/sim_policy.h"

namespace commsched::sim {

void use_default_knob_grid(GridSpec& spec) {
  constexpr uint64_t KiB = 1 << 10, MiB = 1 << 20;
  if (spec.network == NetworkKind::allreduce) {
    spec.partitions = {1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB};
    spec.credit_multipliers = {0, 1, 2};
    spec.small_tensor_bytes = {0, 1 * MiB, 8 * MiB, 32 * MiB};
  } else {
    spec.partitions = {256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB};
    spec.credit_multipliers = {0, 1, 2, 4, 8};
    spec.small_tensor_bytes = {0, 64 * KiB, 8 * MiB};
  }
}

std::unique_ptr<NetworkModel> make_network(const GridSpec& spec, double bandwidth_bps, int workers) {
  if (spec.network == NetworkKind::allreduce)
    return std::make_unique<RingAllreduceNetwork>(RingParams{workers, bandwidth_bps, spec.ring_alpha_s});
  const int servers = spec.servers > 0 ? spec.servers : workers;
  return std::make_unique<PsNetwork>(
      PsParams{workers, servers, bandwidth_bps, bandwidth_bps, spec.latency_s, spec.ps_chunk_bytes});
}

namespace {

struct Candidate {
  EngineConfig config;
  std::string knobs;
};

std::vector<Candidate> candidates(const GridSpec& spec, PolicyKind policy) {
  EngineConfig c = spec.base;
  c.policy = policy;
  if (policy == PolicyKind::fusion)
    return {{c, "threshold " + format_bytes(c.fusion_bytes) + ", cycle " + std::to_string(c.fusion_cycle_s * 1e3) +
                    " ms"}};
  if (policy != PolicyKind::bytescheduler) return {{c, ""}};
  std::vector<Candidate> out;
  for (uint64_t part : spec.partitions)
    for (double mult : spec.credit_multipliers)
      for (uint64_t small : spec.small_tensor_bytes) {
        c.knobs.partition_bytes = part;
        // A credit below one partition still lets one batch go when nothing is in flight: one message at a time.
        c.knobs.credit_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(part * mult));
        c.small_tensor_bytes = small;
        const std::string credit = mult == 0 ? "one batch in flight" : "credit " + format_bytes(c.knobs.credit_bytes);
        out.push_back({c, "partition " + format_bytes(part) + ", " + credit +
                              (small ? ", fuse <= " + format_bytes(small) : "")});
      }
  return out;
}

SimResult simulate_config(const GridSpec& spec, const ModelProfile& model, NetworkModel& net,
                          const EngineConfig& config, bool timeline) {
  auto policy = make_sim_policy(config, net);
  SimOptions opt = spec.sim;
  opt.partition_bytes = config.knobs.partition_bytes;
  opt.record_timeline = timeline;
  return simulate(model, net, *policy, opt);
}

}  // namespace

CellResult run_cell(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                    PolicyKind policy) {
  auto net = make_network(spec, bandwidth_bps, workers);
  CellResult best;
  best.iteration_s = std::numeric_limits<double>::infinity();
  for (const Candidate& cand : candidates(spec, policy)) {
    const SimResult r = simulate_config(spec, model, *net, cand.config, false);
    if (r.iteration_s >= best.iteration_s) continue;
    best = {model.name, bandwidth_bps, workers, r.policy, cand.knobs, r.iteration_s, 0, r.compute_s,
            r.comm_bound_s, r.lower_bound_s, r.dependency_bound_s, r.batches / uint64_t(spec.sim.iterations)};
  }
  best.policy = std::string(policy_name(policy));
  return best;
}

std::vector<CellResult> run_grid(const GridSpec& spec) {
  std::vector<CellResult> out;
  for (const ModelProfile& model : spec.models)
    for (double bw : spec.bandwidths_bps)
      for (int w : spec.workers) {
        const size_t first = out.size();
        for (PolicyKind p : spec.policies) out.push_back(run_cell(spec, model, bw, w, p));
        double wfbp = 0;
        for (size_t i = first; i < out.size(); ++i)
          if (out[i].policy == "wfbp") wfbp = out[i].iteration_s;
        if (wfbp > 0)
          for (size_t i = first; i < out.size(); ++i) out[i].speedup_vs_wfbp = wfbp / out[i].iteration_s;
      }
  return out;
}

std::vector<PolicyTimeline> run_timelines(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps,
                                          int workers, const std::vector<CellResult>& best) {
  auto net = make_network(spec, bandwidth_bps, workers);
  std::vector<PolicyTimeline> out;
  for (PolicyKind p : spec.policies) {
    // Re-run the configuration the grid reported for this cell.
    std::vector<Candidate> cands = candidates(spec, p);
    const Candidate* chosen = &cands.front();
    for (const CellResult& c : best)
      if (c.model == model.name && c.bandwidth_bps == bandwidth_bps && c.workers == workers &&
          c.policy == policy_name(p))
        for (const Candidate& cand : cands)
          if (cand.knobs == c.knobs) chosen = &cand;
    const SimResult r = simulate_config(spec, model, *net, chosen->config, true);
    const int shown = spec.sim.iterations - 1;
    PolicyTimeline t{std::string(policy_name(p)), chosen->knobs, r.iteration_start_s[shown], {}};
    for (const Span& s : r.spans)
      if (s.iteration == shown) t.spans.push_back(s);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace commsched::sim
