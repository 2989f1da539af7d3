#include "simulator/bench_cli.h"
#include "simulator/bench_args.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <tbb/global_control.h>

#include "simulator/grid.h"
#include "simulator/report.h"
#include "scheduler/policy_factory.h"

namespace commsched {
namespace bench {
namespace {

// A value of a knob's grid flag in the row's unit: a size (0/off where 0 means off), or a multiple >= 0.
double grid_value(const KnobSpec& row, const std::string& v) {
  const std::string flag = "--" + std::string(row.grid_flag);
  if (row.tuning.scale == KnobScale::log_multiple) return parse_double(flag, v, 0, 1e9);
  return double(size_value(row.zero).parse(flag, v));
}

// The grid flag's help, from the row.
std::string grid_help(const KnobSpec& row) {
  std::string h = std::string(row.alias) + " values the knob grid searches";
  if (row.tuning.scale == KnobScale::log_multiple)
    h += ", as multiples k of " + std::string(row.tuning.of) + (row.tuning.one_batch_band ? " (0: one batch in flight)" : "");
  else if (row.zero == ZeroSize::off)
    h += " (0: off)";
  return h + "; default: the network's grid (`commsched options --knobs`)";
}

template <class T, class F>
std::vector<T> parse_all(const std::vector<std::string>& values, F parse) {
  std::vector<T> out;
  for (const std::string& v : values) out.push_back(parse(v));
  return out;
}

}  // namespace

sim::GridSpec to_spec(const BenchArgs& a) {
  sim::GridSpec s;
  for (const std::string& m : a.models) s.models.push_back(sim::load_profile(sim::resolve_profile_path(m, {a.profiles_dir})));
  s.bandwidths_bps = parse_all<double>(a.bandwidths, [](const std::string& v) { return parse_rate_bps("--bandwidths", v); });
  s.workers = a.workers;
  for (int w : s.workers)
    if (w < 1) throw InvalidArgument("--workers: " + std::to_string(w) + " (must be >= 1)");
  s.servers = a.servers;
  if (a.network != "ps" && a.network != "allreduce" && a.network != "ring")
    throw InvalidArgument("--network: '" + a.network + "' (allowed: ps, allreduce or its alias ring)");
  s.network = a.network == "ps" ? sim::NetworkKind::ps : sim::NetworkKind::allreduce;
  s.latency_s = parse_seconds("--latency", a.latency);
  s.ps_chunk_bytes = a.ps_chunk == "0" ? 0 : parse_bytes("--ps-chunk", a.ps_chunk);
  s.ps_message_s = parse_seconds("--ps-message-cost", a.ps_message_cost);
  s.ring_alpha_s = parse_seconds("--ring-alpha", a.ring_alpha);
  s.policies = parse_all<PolicyKind>(a.policies, [](const std::string& v) { return parse_policy("--policies", v); });
  sim::use_default_knob_grid(s);
  for (size_t i = 0; i < kKnobCount; ++i)
    if (!a.grid[i].empty()) s.knob_grid[i] = parse_all<double>(a.grid[i], [&](const std::string& v) { return grid_value(kKnobs[i], v); });
  if (a.tune < 0) throw InvalidArgument("--tune: " + std::to_string(a.tune) + " (must be >= 0)");
  s.tune_trials = a.tune;
  s.ps_ingress_limited = !a.emulated_links;
  if (a.link_model != "fifo" && a.link_model != "fair")
    throw InvalidArgument("--link-model: '" + a.link_model + "' (allowed: fifo, fair)");
  s.ps_fair_share = a.link_model == "fair";
  s.ps_reply_overtakes = a.ps_reply_bound;
  if (s.ps_fair_share && a.emulated_links)
    throw InvalidArgument("--link-model fair models real NICs; --emulated-links has no receiving limit to share");
  if (s.ps_fair_share && a.ps_workers == "one")
    throw InvalidArgument("--link-model fair needs every worker simulated (--ps-workers each or auto)");
  if (a.ps_workers == "each") s.ps_each_worker_max = std::numeric_limits<int>::max();
  else if (a.ps_workers == "one") s.ps_each_worker_max = 0;
  else if (a.ps_workers != "auto") throw InvalidArgument("--ps-workers: '" + a.ps_workers + "' (allowed: auto, each, one)");
  s.compression = sim::measured_compression(compression::parse_spec("--compression", a.compression));
  if (!a.stage_costs.empty()) {
    if (a.stage_costs.size() != 2)
      throw InvalidArgument("--stage-costs: " + std::to_string(a.stage_costs.size()) +
                            " values (want two: encode,decode time per MiB, e.g. 370us,413us)");
    s.compression.encode_s_per_mib = parse_seconds("--stage-costs", a.stage_costs[0]);
    s.compression.decode_s_per_mib = parse_seconds("--stage-costs", a.stage_costs[1]);
  }
  s.base.fusion_bytes = parse_bytes("--fusion-bytes", a.fusion_bytes);
  s.base.fusion_cycle_s = parse_seconds("--fusion-cycle", a.fusion_cycle);
  s.sim.iterations = a.iterations;
  s.sim.warmup = a.warmup;
  return s;
}

void write_file(const std::filesystem::path& p, const std::function<void(std::ostream&)>& body) {
  std::ofstream out(p);
  if (!out) throw InvalidArgument("cannot write '" + p.string() + "'");
  body(out);
}

void draw_plots(const BenchArgs& a, const std::filesystem::path& dir) {
  if (!a.plot) return;
  const std::string cmd = std::string(COMMSCHED_PYTHON) + " " + COMMSCHED_PLOT_SCRIPT + " '" + dir.string() + "'";
  if (std::system(cmd.c_str()) != 0) throw InvalidArgument("plotting failed: " + cmd);
}

// "12 of 40 cells, 35 s so far, about 80 s left": the estimate assumes the remaining cells cost what the done ones did.
std::string progress(size_t done, size_t total, std::chrono::steady_clock::time_point t0) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double left = done ? elapsed / double(done) * double(total - done) : 0;
  std::ostringstream s;
  s << done << " of " << total << " cells, " << std::llround(elapsed) << " s so far, about " << std::llround(left)
    << " s left";
  return s.str();
}

namespace {

void run_bench(const BenchArgs& a, const ClusterTrial& cluster) {
  if (a.mode == "cluster") return run_cluster_bench(a, cluster);
  if (a.mode != "sim") throw InvalidArgument("--mode '" + a.mode + "' (allowed: sim, cluster)");
  sim::GridSpec spec = to_spec(a);
  std::optional<tbb::global_control> threads;
  if (a.threads > 0) threads.emplace(tbb::global_control::max_allowed_parallelism, size_t(a.threads));
  const auto t0 = std::chrono::steady_clock::now();
  // Timelines at the lowest bandwidth and first worker count, where scheduling matters most: kept by the grid's runs.
  const double timeline_bw = *std::min_element(spec.bandwidths_bps.begin(), spec.bandwidths_bps.end());
  spec.timeline_bandwidth_bps = timeline_bw;
  spec.timeline_workers = spec.workers.front();
  spec.on_cell = [&](size_t done, size_t total) {
    if (total > 1) std::cerr << "commsched bench: " << progress(done, total, t0) << std::endl;
  };
  const std::vector<sim::CellResult> cells = sim::run_grid(spec);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  namespace fs = std::filesystem;
  const fs::path dir(a.out_dir);
  fs::create_directories(dir);
  write_file(dir / "results.csv", [&](std::ostream& o) { sim::write_csv(o, cells); });
  write_file(dir / "results.json", [&](std::ostream& o) { sim::write_json(o, cells); });
  std::string net = sim::make_network(spec, spec.bandwidths_bps.front(), spec.workers.front())->describe();
  if (spec.network == sim::NetworkKind::ps)
    net += spec.workers.front() <= spec.ps_each_worker_max ? ", every worker simulated" : ", symmetric workers";
  write_file(dir / "results.md", [&](std::ostream& o) {
    sim::write_markdown(o, cells, "Simulated iteration times (" + a.network + "; first cell: " + net + ")");
  });
  for (const sim::ModelProfile& m : spec.models) {
    const auto tl = sim::run_timelines(spec, m, timeline_bw, spec.workers.front(), cells);
    write_file(dir / ("timeline-" + m.name + ".json"),
               [&](std::ostream& o) { sim::write_timelines(o, m.name, timeline_bw, spec.workers.front(), tl); });
  }
  std::cout << "commsched bench: " << cells.size() << " cells in " << secs << " s; wrote " << dir.string()
            << "/results.{csv,json,md} and timeline-*.json\n";
  draw_plots(a, dir);
}

}  // namespace
}  // namespace bench

void add_bench_subcommand(CLI::App& app, ClusterTrial cluster) {
  auto args = std::make_shared<bench::BenchArgs>();
  CLI::App* b = app.add_subcommand("bench", "Compare scheduling policies over models x bandwidths x workers");
  b->add_option("--mode", args->mode,
                "sim (discrete-event simulation) or cluster (each cell as a real local PS cluster beside the "
                "simulator's prediction, every worker simulated and symmetric workers)")
      ->capture_default_str();
  b->add_option("--models", args->models, "profile names in --profiles or paths to .json profiles")
      ->delimiter(',')->capture_default_str();
  b->add_option("--profiles", args->profiles_dir, "folder of model profiles")->capture_default_str();
  b->add_option("--bandwidths", args->bandwidths, "link rates, e.g. 1Gbit,10Gbit")->delimiter(',')->capture_default_str();
  b->add_option("--workers", args->workers, "worker counts")->delimiter(',')->capture_default_str();
  b->add_option("--servers", args->servers, "PS servers (0: one per worker)")->capture_default_str();
  b->add_option("--network", args->network, "ps, or allreduce (alias ring: ring all-reduce)")->capture_default_str();
  b->add_option("--latency", args->latency, "PS one-way latency per message")->capture_default_str();
  b->add_option("--ps-chunk", args->ps_chunk, "PS messages above this stream in chunks (0: never)")
      ->capture_default_str();
  b->add_option("--ps-message-cost", args->ps_message_cost,
                 "PS, real NICs (fifo): fixed cost of one message on each NIC it crosses (0: none; the default was "
                 "measured on the real PS with ps_goodput: kPsMessageS, scheduler/auto_knobs.h)")
      ->capture_default_str();
  b->add_option("--ring-alpha", args->ring_alpha, "all-reduce latency per ring step")->capture_default_str();
  b->add_option("--policies", args->policies, "policies to compare (registered: " + join_names(policy_names()) + ")")
      ->delimiter(',')->capture_default_str();
  for (size_t i = 0; i < kKnobCount; ++i)
    b->add_option("--" + std::string(kKnobs[i].grid_flag), args->grid[i], bench::grid_help(kKnobs[i]))->delimiter(',');
  b->add_flag("--emulated-links", args->emulated_links,
              "PS: model COMMSCHED_EMULATE_RATE (each process's sends paced, receiving unlimited), for validation");
  b->add_option("--link-model", args->link_model,
                 "PS with every worker simulated, real NICs: 'fifo' (each link carries one message at a time, in "
                 "arrival order) or 'fair' (links shared max-min fairly among connections, as TCP shares a NIC)")
      ->capture_default_str();
  b->add_option("--ps-reply-bound", args->ps_reply_bound,
                 "PS, every worker simulated (fifo or emulated links): each server sends its most urgent ready reply "
                 "first (receipts, then the lowest priority), a reply at the latest once this many have left since it "
                 "was ready, as the real server does (COMMSCHED_PS_REPLY_BOUND); 0: arrival order")
      ->capture_default_str();
  b->add_option("--ps-workers", args->ps_workers,
                 "PS: 'each' simulates every worker on its own (its own policy; cost grows with W), 'one' a single representative of symmetric workers (cost independent of W), 'auto' "
                 "each up to 16 workers")
      ->capture_default_str();
  b->add_option("--tune", args->tune,
                 "bytescheduler knobs found by the Bayesian optimiser in N simulated trials instead of the grid (0: grid)")
      ->capture_default_str();
  b->add_option("--compression", args->compression,
                "gradient compression modelled: none, fp16, bf16, topk[:RATIO], signsgd (compressed bytes, encode and "
                "decode time on the workers; top-k and signSGD also decode and encode on the PS servers)")
      ->capture_default_str();
  b->add_option("--stage-costs", args->stage_costs,
                "encode,decode CPU time per MiB of gradient (default: the costs measured by stage_micro_bench for "
                "the scheme, bench/RESULTS.md)")
      ->delimiter(',');
  b->add_option("--fusion-bytes", args->fusion_bytes, "fusion policy threshold")->capture_default_str();
  b->add_option("--fusion-cycle", args->fusion_cycle, "fusion policy cycle")->capture_default_str();
  b->add_option("--iterations", args->iterations, "simulated iterations")->capture_default_str();
  b->add_option("--warmup", args->warmup, "leading iterations not measured")->capture_default_str();
  b->add_option("-o,--out", args->out_dir, "output folder")->capture_default_str();
  b->add_flag("--plot", args->plot, "also draw PNGs with simulator/plot.py");
  b->add_option("--threads", args->threads,
                "simulations run at once (rows of the grid and a knob grid's candidates; results do not depend on it); "
                "0: one per core")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  b->add_option("--trials", args->trials, "cluster: runs per cell")->capture_default_str();
  b->add_option("--trial-iterations", args->trial_iterations, "cluster: measured iterations per run")
      ->capture_default_str();
  b->add_option("--trial-warmup", args->trial_warmup,
                "cluster: leading iterations not measured (iteration 1 still waits for iteration 0's key assignment: "
                "keep >= 2)")
      ->capture_default_str();
  b->add_option("--attempts", args->attempts, "cluster: a failed run is started again up to this many times in all")
      ->capture_default_str();
  b->add_option("--links", args->links,
                "cluster: 'emulated' (the transport's token bucket on each process's sends over loopback, "
                "COMMSCHED_EMULATE_RATE) or 'netns' (root: every process in its own network namespace on a bridge, "
                "its link shaped with tbf both ways; predicted with the simulator's real-NIC model, --link-model)")
      ->check(CLI::IsMember({"emulated", "netns"}))->capture_default_str();
  b->add_option("--auth", args->auth,
                "cluster, netns: 'on' (a fresh secret per trial: ZeroMQ CURVE authenticates and encrypts every byte, "
                "CPU the simulator does not charge) or 'off' (COMMSCHED_AUTH=off, as on a trusted network)")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  b->add_option("--link-efficiency", args->link_efficiency,
                "cluster: payload share of the link rate given to the simulator (0: by --links; netns 1448/1514, TCP "
                "payload per 1514-byte frame with timestamps, as tbf counts frames; emulated 1, whose bucket counts "
                "message bytes)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  b->add_option("--resimulate", args->resimulate,
                "cluster: run no cluster; simulate the real cells of an earlier cluster.csv again (after a simulator "
                "change). The knob flags, --latency and --links must match that run")
      ->check(CLI::ExistingFile);
  b->callback([args, cluster = std::move(cluster)] { bench::run_bench(*args, cluster); });
}

}  // namespace commsched
