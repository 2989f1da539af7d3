#include "simulator/grid.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>

#include <tbb/parallel_for.h>

#include "simulator/row_label.h"
#include "simulator/sim_policy.h"
#include "scheduler/auto_knobs.h"
#include "scheduler/policy_factory.h"
#include "scheduler/tsan_handoff.h"
#include "tuner/bayes_opt.h"

namespace commsched::sim {

std::array<std::vector<double>, kKnobCount> default_knob_grid(NetworkKind network) {
  std::array<std::vector<double>, kKnobCount> out;
  for (size_t i = 0; i < kKnobCount; ++i) {
    const KnobGrid& g = network == NetworkKind::ps ? kKnobs[i].ps : kKnobs[i].allreduce;
    out[i].assign(g.values.begin(), g.values.end());
  }
  return out;
}

tuner::SearchSpaceBounds default_tune_bounds(NetworkKind network) {
  tuner::SearchSpaceBounds b;
  for (size_t i = 0; i < kKnobCount; ++i) {
    const KnobGrid& g = network == NetworkKind::ps ? kKnobs[i].ps : kKnobs[i].allreduce;
    if (g.tune_min > 0) b.knobs[i].min = g.tune_min;
    if (g.tune_max > 0) b.knobs[i].max = g.tune_max;
  }
  return b;
}

void use_default_knob_grid(GridSpec& spec) {
  spec.knob_grid = default_knob_grid(spec.network);
  spec.tune_bounds = default_tune_bounds(spec.network);
}

std::vector<double>& GridSpec::grid(std::string_view knob) {
  return knob_grid[static_cast<size_t>(&registered_knob(knob) - kKnobs)];
}
const std::vector<double>& GridSpec::grid(std::string_view knob) const {
  return knob_grid[static_cast<size_t>(&registered_knob(knob) - kKnobs)];
}

PsParams ps_params(const GridSpec& spec, double bandwidth_bps, int workers) {
  const int servers = spec.servers > 0 ? spec.servers : workers;
  PsParams p{workers, servers, bandwidth_bps, bandwidth_bps, spec.latency_s, spec.ps_chunk_bytes, true,
             spec.ps_ingress_limited};
  p.fair_share = spec.ps_fair_share;
  p.message_s = spec.ps_message_s;
  p.reply_overtakes = spec.ps_reply_overtakes;
  return p;
}

std::unique_ptr<NetworkModel> make_network(const GridSpec& spec, double bandwidth_bps, int workers) {
  if (spec.network == NetworkKind::allreduce)
    return with_compression(std::make_unique<RingAllreduceNetwork>(RingParams{workers, bandwidth_bps, spec.ring_alpha_s}),
                            spec.compression);
  return with_compression(std::make_unique<PsNetwork>(ps_params(spec, bandwidth_bps, workers)), spec.compression,
                          workers);
}

namespace {

// tbb::parallel_for over [0, n), one index a task. oneTBB's spawn and join are invisible to ThreadSanitizer (the
// distribution's library is not instrumented), so the edges are stated: what the caller wrote before reaches every
// iteration, and what the iterations wrote reaches the caller after the join (not one iteration to another: a race
// between two iterations is still seen).
template <typename Body>
void parallel_indices(size_t n, Body&& body) {
  const char start = 0, finish = 0;
  handed_over(&start);
  tbb::parallel_for(size_t(0), n, size_t(1), [&](size_t i) {
    taken_over(&start);
    body(i);
    handed_over(&finish);
  });
  taken_over(&finish);
}

struct Candidate {
  EngineConfig config;
  std::string knobs;
};

bool reads(const PolicyInfo& info, std::string_view option) {
  return std::find(info.options.begin(), info.options.end(), option) != info.options.end();
}

// The knob rows a policy reads (PolicyInfo::options), in table order (a multiple after the knob it scales with): the
// grid's axes and the tuner's. A new policy that reads knobs is searched, and one that reads none runs once, without
// an edit here.
std::vector<KnobSpec> knobs_read(const PolicyInfo& info) {
  std::vector<KnobSpec> out;
  for (const KnobSpec& k : kKnobs)
    if (reads(info, k.name)) out.push_back(k);
  return out;
}

// How one option's value reads in a result table; empty: not shown (the simulator sets MG-WFBP's cost model from
// the network, and the stall guard is not a knob).
std::string describe_option(std::string_view option, const EngineConfig& c) {
  if (const int knob = knob_index(option); knob >= 0) return commsched::describe_knobs(c.knobs, std::span(kKnobs).subspan(knob, 1));
  if (option == "fusion_bytes") return "threshold " + format_bytes(c.fusion_bytes);
  if (option == "fusion_cycle") return "cycle " + format_seconds(c.fusion_cycle_s);
  return "";
}

std::string describe_config(const EngineConfig& c) {
  std::string out;
  for (std::string_view option : policy_info(c.policy).options)
    if (std::string d = describe_option(option, c); !d.empty()) out += (out.empty() ? "" : ", ") + d;
  return out;
}

// The tuner's point u (one coordinate per searched knob the policy reads) as that policy's knobs.
Candidate knobs_at(const tuner::SearchSpace& space, const EngineConfig& base, std::span<const double> u) {
  EngineConfig c = base;
  const tuner::SearchSpace::Values v = space.to_values(u);
  for (size_t i = 0; i < v.size(); ++i) c.knobs.*space.axes()[i].knob->field = v[i];
  return {c, describe_config(c) + " (tuned)"};
}

std::vector<Candidate> candidates(const GridSpec& spec, PolicyKind policy) {
  EngineConfig base = spec.base;
  base.policy = policy;
  std::vector<EngineConfig> configs = {base};
  for (const KnobSpec& knob : knobs_read(policy_info(policy))) {
    std::vector<EngineConfig> next;
    for (const EngineConfig& c : configs)
      for (double v : spec.knob_grid[static_cast<size_t>(knob_index(knob.name))]) {
        EngineConfig& n = next.emplace_back(c);
        n.knobs.*knob.field = knob_value_from_grid(knob, v, n.knobs);
      }
    configs = std::move(next);
  }
  std::vector<Candidate> out;
  for (EngineConfig& c : configs) {
    std::string knobs = describe_config(c);
    out.push_back({std::move(c), std::move(knobs)});
  }
  return out;
}

bool each_worker(const GridSpec& spec, int workers) {
  return spec.network == NetworkKind::ps && workers <= spec.ps_each_worker_max;
}

SimResult simulate_config(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                          NetworkModel& net, const EngineConfig& config, bool timeline, double abandon_above_s = 0) {
  SimOptions opt = spec.sim;
  opt.partition_bytes = config.knobs.partition_bytes;
  opt.record_timeline = timeline;
  opt.abandon_above_s = abandon_above_s;
  if (each_worker(spec, workers))
    return simulate_each_worker(model, ps_params(spec, bandwidth_bps, workers),
                                [&] { return make_sim_policy(config, net, /*symmetric_workers=*/false); }, opt,
                                spec.compression);
  if (spec.network == NetworkKind::ps && spec.ps_fair_share)  // the symmetric model has FIFO links only
    throw std::invalid_argument("the fair link model needs every worker simulated; " + std::to_string(workers) +
                                " workers are above the limit for that (--ps-workers each lifts it)");
  auto policy = make_sim_policy(config, net);
  return simulate(model, net, *policy, opt);
}

// The last measured iteration of a run that recorded its timeline (worker 0's spans).
std::vector<Span> shown_iteration(const SimResult& r, int iterations) {
  std::vector<Span> out;
  for (const Span& s : r.spans)
    if (s.iteration == iterations - 1) out.push_back(s);
  return out;
}

CellResult cell_result(const ModelProfile& model, double bandwidth_bps, int workers, std::string policy,
                       std::string knobs, const EngineConfig& config, const SimResult& r, int iterations,
                       bool timeline = false) {
  CellResult c{model.name, bandwidth_bps, workers, std::move(policy), std::move(knobs), config, r.iteration_s, 0,
               r.compute_s, r.comm_bound_s, r.lower_bound_s, r.dependency_bound_s, r.batches / uint64_t(iterations),
               r.links, std::nullopt, 0};
  if (timeline) {
    c.timeline = shown_iteration(r, iterations);
    c.timeline_start_s = r.iteration_start_s[size_t(iterations - 1)];
  }
  return c;
}

bool keeps_timeline(const GridSpec& spec, double bandwidth_bps, int workers) {
  return spec.timeline_workers > 0 && workers == spec.timeline_workers && bandwidth_bps == spec.timeline_bandwidth_bps;
}

// The order to try a knob grid in: with every PS worker simulated (slow), fastest first as the symmetric model (one
// worker for all, cheap) predicts, so that a fast candidate is found early and the slower ones are abandoned soon;
// otherwise the grid's own order.
std::vector<size_t> search_order(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                                 const std::vector<Candidate>& cands) {
  std::vector<size_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!each_worker(spec, workers) || spec.ps_fair_share) return order;  // the symmetric model has FIFO links only
  GridSpec symmetric = spec;
  symmetric.ps_each_worker_max = 0;
  auto net = make_network(symmetric, bandwidth_bps, workers);
  std::vector<double> predicted;
  for (const Candidate& c : cands)
    predicted.push_back(simulate_config(symmetric, model, bandwidth_bps, workers, *net, c.config, false).iteration_s);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return predicted[a] < predicted[b]; });
  return order;
}

// The fastest candidate, the first in grid order among equals, into `best`. Candidates run in parallel (each
// simulation owns its policy and network model), each thread taking the next in search order (not a slice of the
// order per thread, which would start the second thread halfway down the predicted ranking).
// Abandoning a candidate once it is sure to be slower than the best so far (a hair of slack for the rounding of that
// bound) changes neither the result nor, since ties go to the lower index, which candidate is reported.
void search_grid(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                 const std::vector<Candidate>& cands, CellResult& best) {
  const std::vector<size_t> order = search_order(spec, model, bandwidth_bps, workers, cands);
  std::mutex mu;
  size_t best_index = cands.size();
  auto limit = [&] {
    std::lock_guard lock(mu);
    return best_index < cands.size() ? best.iteration_s * (1 + 1e-9) : 0.0;
  };
  std::atomic<size_t> next{0};
  const bool timeline = keeps_timeline(spec, bandwidth_bps, workers);
  parallel_indices(order.size(), [&](size_t) {
    const size_t i = order[next.fetch_add(1, std::memory_order_relaxed)];
    auto net = make_network(spec, bandwidth_bps, workers);
    const SimResult r = simulate_config(spec, model, bandwidth_bps, workers, *net, cands[i].config, timeline, limit());
    std::lock_guard lock(mu);
    if (r.abandoned || r.iteration_s > best.iteration_s || (r.iteration_s == best.iteration_s && i > best_index))
      return;
    best = cell_result(model, bandwidth_bps, workers, r.policy, cands[i].knobs, cands[i].config, r,
                       spec.sim.iterations, timeline);
    best_index = i;
  });
}

// The fastest of spec.tune_trials points the Bayesian optimiser asks for, into `best`. One after another: each
// point depends on the times of the ones before.
void search_tuned(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                  PolicyKind policy, const std::vector<KnobSpec>& knobs, CellResult& best) {
  auto net = make_network(spec, bandwidth_bps, workers);
  const tuner::SearchSpace space(spec.tune_bounds, knobs);
  EngineConfig base = spec.base;
  base.policy = policy;
  tuner::BayesOptOptions o;
  o.dim = space.dim();
  tuner::BayesOpt bo(o);
  const bool timeline = keeps_timeline(spec, bandwidth_bps, workers);
  for (int i = 0; i < spec.tune_trials; ++i) {
    const std::vector<double> u = bo.ask();
    const Candidate cand = knobs_at(space, base, u);
    const SimResult r = simulate_config(spec, model, bandwidth_bps, workers, *net, cand.config, timeline);
    if (r.iteration_s < best.iteration_s)
      best = cell_result(model, bandwidth_bps, workers, r.policy, cand.knobs, cand.config, r, spec.sim.iterations,
                         timeline);
    bo.tell(u, r.iteration_s);
  }
}

}  // namespace

CellResult run_cell(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                    PolicyKind policy) {
  CellResult best;
  best.iteration_s = std::numeric_limits<double>::infinity();
  const std::vector<KnobSpec> knobs = knobs_read(policy_info(policy));
  if (spec.tune_trials > 0 && !knobs.empty())
    search_tuned(spec, model, bandwidth_bps, workers, policy, knobs, best);
  else
    search_grid(spec, model, bandwidth_bps, workers, candidates(spec, policy), best);
  best.policy = std::string(policy_name(policy));
  return best;
}

std::vector<CellResult> rank_candidates(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps,
                                        int workers, PolicyKind policy) {
  auto net = make_network(spec, bandwidth_bps, workers);
  std::vector<CellResult> out;
  for (const Candidate& cand : candidates(spec, policy)) {
    const SimResult r = simulate_config(spec, model, bandwidth_bps, workers, *net, cand.config, false);
    out.push_back(cell_result(model, bandwidth_bps, workers, std::string(policy_name(policy)), cand.knobs, cand.config,
                              r, spec.sim.iterations));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const CellResult& a, const CellResult& b) { return a.iteration_s < b.iteration_s; });
  return out;
}

bool has_auto_knobs(PolicyKind policy) {
  const PolicyInfo& info = policy_info(policy);
  return std::any_of(std::begin(kKnobs), std::end(kKnobs), [&](const KnobSpec& k) { return reads(info, k.name); });
}

std::string auto_row_label(PolicyKind policy) { return row_name(policy_name(policy), KnobSource::automatic); }

ClusterShape cluster_shape(const GridSpec& spec, double bandwidth_bps, int workers) {
  // The PS partition rule weighs the per-message cost the cell charges (--ps-message-cost), as the plugin passes its
  // host's (0 there means the rule's default).
  if (spec.network == NetworkKind::ps)
    return {workers, ps_params(spec, bandwidth_bps, workers).servers, bandwidth_bps, 0, {spec.ps_message_s, ""}};
  return {workers, 0, bandwidth_bps, spec.ring_alpha_s, {}};
}

CellResult run_auto_cell(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                         PolicyKind policy) {
  auto net = make_network(spec, bandwidth_bps, workers);
  EngineConfig c = spec.base;
  c.policy = policy;
  apply_auto_knobs(c, cluster_shape(spec, bandwidth_bps, workers));
  const SimResult r = simulate_config(spec, model, bandwidth_bps, workers, *net, c, false);
  return cell_result(model, bandwidth_bps, workers, auto_row_label(policy), describe_config(c) + " (automatic)", c, r,
                     spec.sim.iterations);
}

std::vector<CellResult> run_grid(const GridSpec& spec) {
  struct Row {
    const ModelProfile* model;
    double bandwidth_bps;
    int workers;
    PolicyKind policy;
    bool automatic;  // the row at the product's automatic knobs
    size_t cell;
  };
  struct Cell {
    size_t first, size;
    std::atomic<size_t> left;
  };
  std::vector<Row> rows;
  std::deque<Cell> cells;  // atomics do not move
  for (const ModelProfile& model : spec.models)
    for (double bw : spec.bandwidths_bps)
      for (int w : spec.workers) {
        const size_t first = rows.size();
        for (PolicyKind p : spec.policies) {
          if (has_auto_knobs(p)) rows.push_back({&model, bw, w, p, true, cells.size()});
          rows.push_back({&model, bw, w, p, false, cells.size()});
        }
        cells.emplace_back(first, rows.size() - first, rows.size() - first);
      }
  // Every row is its own simulation: they run in parallel, each into its place, so the result and its order are those
  // of running them one after another.
  std::vector<CellResult> out(rows.size());
  std::mutex progress;
  size_t done = 0;
  parallel_indices(rows.size(), [&](size_t i) {
    const Row& r = rows[i];
    out[i] = r.automatic ? run_auto_cell(spec, *r.model, r.bandwidth_bps, r.workers, r.policy)
                         : run_cell(spec, *r.model, r.bandwidth_bps, r.workers, r.policy);
    Cell& cell = cells[r.cell];
    if (cell.left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;  // the cell's last row finishes it
    set_speedups_vs_wfbp(std::span(out).subspan(cell.first, cell.size));
    std::lock_guard lock(progress);
    if (spec.on_cell) spec.on_cell(++done, cells.size());
  });
  return out;
}

void set_speedups_vs_wfbp(std::span<CellResult> cell) {
  double wfbp = 0;
  for (const CellResult& c : cell)
    if (c.policy == policy_name(PolicyKind::wfbp)) wfbp = c.iteration_s;
  if (wfbp > 0)
    for (CellResult& c : cell) c.speedup_vs_wfbp = wfbp / c.iteration_s;
}

std::vector<PolicyTimeline> run_timelines(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps,
                                          int workers, const std::vector<CellResult>& best) {
  std::vector<PolicyTimeline> out(spec.policies.size());
  parallel_indices(spec.policies.size(), [&](size_t i) {
    const PolicyKind p = spec.policies[i];
    // The configuration the grid reported for this cell, and its timeline if the grid kept it.
    std::vector<Candidate> cands = candidates(spec, p);
    Candidate chosen = cands.front();
    const CellResult* row = nullptr;
    for (const CellResult& c : best)
      if (c.model == model.name && c.bandwidth_bps == bandwidth_bps && c.workers == workers &&
          c.policy == policy_name(p))
        chosen = {c.config, c.knobs}, row = &c;
    if (row && row->timeline) {
      out[i] = {std::string(policy_name(p)), chosen.knobs, row->timeline_start_s, *row->timeline};
      return;
    }
    auto net = make_network(spec, bandwidth_bps, workers);
    const SimResult r = simulate_config(spec, model, bandwidth_bps, workers, *net, chosen.config, true);
    const int shown = spec.sim.iterations - 1;
    out[i] = {std::string(policy_name(p)), chosen.knobs, r.iteration_start_s[size_t(shown)],
              shown_iteration(r, spec.sim.iterations)};
  });
  return out;
}

}  // namespace commsched::sim
