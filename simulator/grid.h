// The comparison grid behind `commsched bench`: models x bandwidths x workers x policies; each policy's knobs (the
// engine options it reads, from the policy registry) searched over a small grid (the best is reported, as a tuner
// would find it).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "scheduler/auto_knobs.h"
#include "simulator/compression_model.h"
#include "simulator/network.h"
#include "workload/profile.h"
#include "simulator/simulator.h"
#include "scheduler/auto_knobs.h"
#include "scheduler/config.h"
#include "scheduler/policy_factory.h"
#include "tuner/search_space.h"

namespace commsched::sim {

enum class NetworkKind { ps, allreduce };

// The knob rows' simulator grids (options/knobs.h KnobSpec::ps, ::allreduce), per row of kKnobs in the row's unit.
std::array<std::vector<double>, kKnobCount> default_knob_grid(NetworkKind network);
// The tuner's registered ranges, with the network's own where a row's grid has one (--tune).
tuner::SearchSpaceBounds default_tune_bounds(NetworkKind network);

struct GridSpec {
  std::vector<ModelProfile> models;
  std::vector<double> bandwidths_bps = {1e9, 10e9, 25e9, 100e9};
  std::vector<int> workers = {8};
  std::vector<PolicyKind> policies = all_policies();  // every registered policy (scheduler/policy_factory.h)
  NetworkKind network = NetworkKind::ps;
  int servers = 0;              // PS servers; 0: as many as workers (co-located, as BytePS deploys them)
  double latency_s = 25e-6;     // PS one-way latency per message
  uint64_t ps_chunk_bytes = 4ull << 20;  // PS messages above this are streamed in chunks (as the PS backend does)
  bool ps_ingress_limited = true;        // false: model the EMULATED links (senders paced, receivers not)
  double ps_message_s = kPsMessageS;     // PS: fixed cost per message on each real NIC it crosses (PsParams)
  bool ps_fair_share = false;            // real NICs, every worker simulated: links shared max-min fairly (flow_net.h)
  uint64_t ps_reply_overtakes = ReplyOrder<int>::kDefaultMaxOvertakes;  // every worker simulated (PsParams)
  // PS cells with at most this many workers run simulate_each_worker (ps_cluster.h), every worker on its own (cost
  // grows with W); bigger ones one representative of symmetric workers (simulate(), PsNetwork).
  int ps_each_worker_max = 16;
  double ring_alpha_s = 5e-6;   // all-reduce per-step latency
  CompressionModel compression;  // compressed bytes and stage time (compression_model.h); scheme none: off
  // The knob grid: per knob row (options/knobs.h kKnobs, in order) the values searched for every policy that reads
  // the knob (PolicyInfo::options), in the row's unit: bytes (fusion bound 0: off) or, for the credit, multiples k
  // of the partition (k = 0: one batch in flight at a time, which latency-bound collectives need).
  std::array<std::vector<double>, kKnobCount> knob_grid = default_knob_grid(NetworkKind::ps);
  // > 0: those knobs are found by the Bayesian optimiser (tuner::BayesOpt over the online tuner's own SearchSpace)
  // in this many simulated trials instead of the grid, within tune_bounds.
  int tune_trials = 0;
  tuner::SearchSpaceBounds tune_bounds = default_tune_bounds(NetworkKind::ps);
  EngineConfig base;            // fusion threshold and cycle, and defaults for everything else
  SimOptions sim;
  // run_grid keeps the timeline of each searched row in this cell (bandwidth, workers) for run_timelines, which then
  // need not simulate them again; 0: in none.
  double timeline_bandwidth_bps = 0;
  int timeline_workers = 0;
  // Called after each cell (model, bandwidth, workers: every policy of it) with the cells done and in all; for
  // progress lines (a grid at 16 workers per worker takes minutes).
  std::function<void(size_t done, size_t total)> on_cell;

  // The grid of one registered knob; throws InvalidArgument naming it when none.
  std::vector<double>& grid(std::string_view knob);
  const std::vector<double>& grid(std::string_view knob) const;
};

// A policy that reads the knobs (a row of options/knobs.h kKnobs) gets a second row in every cell, at the
// knobs the product picks by itself (scheduler/auto_knobs.h), labelled "<policy>-auto", beside the best of the grid or
// of the tuner ("<policy>").
bool has_auto_knobs(PolicyKind policy);
std::string auto_row_label(PolicyKind policy);
// The scheduler's automatic row, which the targets judge (report.h).
inline constexpr std::string_view kAutoKnobsRow = "bytescheduler-auto";

struct CellResult {
  std::string model;
  double bandwidth_bps = 0;
  int workers = 0;
  std::string policy;
  std::string knobs;            // the configuration reported (the best found, where knobs were searched)
  EngineConfig config;          // that configuration
  double iteration_s = 0;
  double speedup_vs_wfbp = 0;   // 0 when wfbp was not run
  double compute_s = 0;
  double comm_bound_s = 0;
  double lower_bound_s = 0;       // max(compute, comm)
  double dependency_bound_s = 0;  // see dependency_bound_s() in simulator.h
  uint64_t batches_per_iteration = 0;
  LinkUse links;                  // how busy the links were (every PS worker simulated only)
  // In GridSpec's timeline cell (run_cell's rows): the spans of worker 0's last measured iteration, and its start.
  std::optional<std::vector<Span>> timeline;
  double timeline_start_s = 0;
};

// The knob grid and --tune ranges of spec.network (the rows' grids: all-reduce reaches bigger partitions and fusion
// bounds).
void use_default_knob_grid(GridSpec& spec);

// The row of `policy` at the automatic knobs for this cell's shape (PS: workers and servers; all-reduce: workers, the
// link rate and the ring's step latency).
CellResult run_auto_cell(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                         PolicyKind policy = PolicyKind::bytescheduler);
ClusterShape cluster_shape(const GridSpec& spec, double bandwidth_bps, int workers);

std::unique_ptr<NetworkModel> make_network(const GridSpec& spec, double bandwidth_bps, int workers);
PsParams ps_params(const GridSpec& spec, double bandwidth_bps, int workers);
// One policy in one cell: the best over its knob grid (or tuner trials), the product of the axes of the options it
// reads (PolicyInfo::options); a policy without such options runs once.
CellResult run_cell(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps, int workers,
                    PolicyKind policy);
// Every candidate of the knob grid for `policy` in one cell, fastest first.
std::vector<CellResult> rank_candidates(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps,
                                        int workers, PolicyKind policy);
// Every cell, with speedups over WFBP filled in.
std::vector<CellResult> run_grid(const GridSpec& spec);
// Fills speedup_vs_wfbp in the results of one cell (one per policy); left 0 when WFBP is not among them.
void set_speedups_vs_wfbp(std::span<CellResult> cell);

// One iteration's spans per policy (the last measured iteration), for the timeline plot.
struct PolicyTimeline {
  std::string policy;
  std::string knobs;
  double iteration_start_s = 0;
  std::vector<Span> spans;
};
// The rows' recorded timelines where `best` has them (GridSpec::timeline_*), else each simulated again.
std::vector<PolicyTimeline> run_timelines(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps,
                                          int workers, const std::vector<CellResult>& best);

}  // namespace commsched::sim
