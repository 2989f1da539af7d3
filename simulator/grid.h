// The comparison grid behind `commsched bench`: models x bandwidths x workers x policies; each policy's knobs (the
// engine options it reads, from the policy registry) searched over a small grid (the best is reported, as a tuner
// would find it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "simulator/compression_model.h"
#include "simulator/network.h"
#include "workload/profile.h"
#include "simulator/simulator.h"
#include "scheduler/auto_knobs.h"
#include "scheduler/config.h"
#include "scheduler/policy_factory.h"

namespace commsched::sim {

enum class NetworkKind { ps, allreduce };

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
  bool ps_fair_share = false;            // real NICs, every worker simulated: links shared max-min fairly (flow_net.h)
  // PS cells with at most this many workers run simulate_each_worker (ps_cluster.h), every worker on its own (cost
  // grows with W); bigger ones one representative of symmetric workers (simulate(), PsNetwork).
  int ps_each_worker_max = 16;
  double ring_alpha_s = 5e-6;   // all-reduce per-step latency
  CompressionModel compression;  // compressed bytes and stage time (compression_model.h); scheme none: off
  // The knob grid, per engine option, for every policy that reads it (PolicyInfo::options): partition sizes
  // (partition_bytes), credit as a multiple k of the partition (credit_bytes; k = 0: one batch in flight at a time,
  // which latency-bound collectives need), small-tensor fusion bounds (small_tensor_bytes; 0: off).
  std::vector<uint64_t> partitions = {256ull << 10, 1ull << 20, 4ull << 20, 16ull << 20};
  std::vector<double> credit_multipliers = {0, 1, 2, 4, 8};
  std::vector<uint64_t> small_tensor_bytes = {0, 64ull << 10, 8ull << 20};
  // > 0: those options are found by the Bayesian optimiser (tuner::BayesOpt, as the online tuner uses) in this many
  // simulated trials instead of the grid above: partition (log scale, tune_min..tune_max_partition), credit (one
  // batch in flight, or 1x..16x the partition) and small-tensor fusion bound (off, or 64 KiB..512 MiB).
  int tune_trials = 0;
  uint64_t tune_min_partition = 64ull << 10;
  uint64_t tune_max_partition = 64ull << 20;
  EngineConfig base;            // fusion threshold and cycle, and defaults for everything else
  SimOptions sim;
  // Called after each cell (model, bandwidth, workers: every policy of it) with the cells done and in all; for
  // progress lines (a grid at 16 workers per worker takes minutes).
  std::function<void(size_t done, size_t total)> on_cell;
};

// A policy that reads the knobs (partition_bytes or credit_bytes, kKnobs) gets a second row in every cell, at the
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
};

// The knob grid searched by default. All-reduce at scale pays 2(W-1) latencies per collective, so its grid reaches
// bigger partitions and fusion bounds (as ByteScheduler itself tunes larger partitions for all-reduce); so does the
// tuner's partition range.
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
std::vector<PolicyTimeline> run_timelines(const GridSpec& spec, const ModelProfile& model, double bandwidth_bps,
                                          int workers, const std::vector<CellResult>& best);

}  // namespace commsched::sim
