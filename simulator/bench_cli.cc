#include "simulator/bench_cli.h"

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
namespace {

// Raw option values; parsed with the project's value parsers so errors name the option and the value.
struct BenchArgs {
  std::string mode = "sim";
  std::vector<std::string> models = {"vgg16", "resnet50", "bert-base", "bert-large", "transformer-base"};
  std::string profiles_dir = COMMSCHED_PROFILES_DIR;
  std::vector<std::string> bandwidths = {"1Gbit", "10Gbit", "25Gbit", "100Gbit"};
  std::vector<int> workers = {8};
  int servers = 0;
  std::string network = "ps";
  std::string latency = "25us";
  std::string ps_chunk = "4MiB";
  std::string ring_alpha = "5us";
  std::vector<std::string> policies = policy_names();  // every registered policy
  // Per knob row (options/knobs.h), its grid flag's values; empty: the network's default grid.
  std::array<std::vector<std::string>, kKnobCount> grid;
  int tune = 0;
  bool emulated_links = false;
  std::string link_model = "fifo";
  std::string ps_workers = "auto";
  std::string compression = "none";
  std::vector<std::string> stage_costs;  // encode, decode per MiB; empty: measured_compression's
  std::string fusion_bytes = "64MiB";
  std::string fusion_cycle = "5ms";
  int iterations = 12;
  int warmup = 4;
  std::string out_dir = "bench-results";
  bool plot = false;
  int threads = 0;  // simulations run at once; 0: every core
  // --mode cluster
  int trials = 3;
  int trial_iterations = 4;
  int trial_warmup = 2;
  int attempts = 3;
};

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

// Two-sided 95% interval of the mean of `v` (Student t), 0 for fewer than two values.
double ci95(const std::vector<double>& v) {
  static constexpr double t95[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228};
  if (v.size() < 2) return 0;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  var /= double(v.size() - 1);
  return t95[std::min<size_t>(v.size() - 1, std::size(t95)) - 1] * std::sqrt(var / double(v.size()));
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

// --mode cluster: every cell as a real local PS cluster (links emulated), --trials times, with the simulator's
// prediction for the same cell and knobs (every worker simulated, emulated links) beside it. One knob setting: the
// first --partitions, --credit-multipliers and --small-tensor value (1 MiB, 4x, 64 KiB if not given).
void run_cluster_bench(const BenchArgs& a, const ClusterTrial& trial) {
  if (!trial)
    throw InvalidArgument("--mode cluster: this executable cannot launch clusters; use `commsched bench --mode cluster`");
  if (a.network != "ps") throw InvalidArgument("--mode cluster: only --network ps runs as a local cluster");
  if (a.trials < 1 || a.trial_iterations < 1 || a.trial_warmup < 0 || a.attempts < 1)
    throw InvalidArgument("--mode cluster: need --trials >= 1, --trial-iterations >= 1, --trial-warmup >= 0, "
                          "--attempts >= 1");
  if (a.tune > 0) throw InvalidArgument("--tune: simulation only (cluster mode runs the knobs it is given)");
  if (a.compression != "none")
    throw InvalidArgument("--compression '" + a.compression + "': simulation only (cluster mode runs uncompressed)");
  auto single = [](const char* opt, size_t n) {
    if (n > 1) throw InvalidArgument(std::string(opt) + ": cluster mode runs one knob setting, got " + std::to_string(n));
  };
  for (size_t i = 0; i < kKnobCount; ++i) single(("--" + std::string(kKnobs[i].grid_flag)).c_str(), a.grid[i].size());
  BenchArgs simulated = a;
  auto first_or = [&](std::string_view knob, const char* fallback) {
    const std::vector<std::string>& given = a.grid[size_t(knob_index(knob))];
    simulated.grid[size_t(knob_index(knob))] = {given.empty() ? fallback : given.front()};
  };
  first_or("partition_bytes", "1MiB");
  first_or("credit_bytes", "4");
  first_or("small_tensor_bytes", "64KiB");
  simulated.emulated_links = true;
  simulated.ps_workers = "each";
  const sim::GridSpec spec = to_spec(simulated);
  const auto partition = uint64_t(spec.grid("partition_bytes").front());
  const uint64_t credit = std::max<uint64_t>(1, uint64_t(double(partition) * spec.grid("credit_bytes").front()));
  const auto small_tensor = uint64_t(spec.grid("small_tensor_bytes").front());

  struct Row {
    sim::CellResult real, predicted;
    double ci95_s;
    std::vector<double> trials_s;
    std::string bandwidth;
  };
  std::vector<Row> rows;
  const size_t total_rows = spec.models.size() * spec.bandwidths_bps.size() * spec.workers.size() * spec.policies.size();
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t mi = 0; mi < spec.models.size(); ++mi)
    for (size_t bi = 0; bi < spec.bandwidths_bps.size(); ++bi)
      for (int w : spec.workers)
        for (PolicyKind p : spec.policies) {
          ClusterTrialSpec t{a.models[mi], a.bandwidths[bi], w, a.servers > 0 ? a.servers : w,
                             std::string(policy_name(p)), std::to_string(partition), std::to_string(credit),
                             std::to_string(small_tensor), a.trial_iterations, a.trial_warmup};
          Row r;
          r.bandwidth = a.bandwidths[bi];
          for (int i = 0; i < a.trials; ++i)
            for (int attempt = 1;; ++attempt) {
              try {
                const std::vector<double> its = trial(t);
                if (its.empty()) throw std::runtime_error("no iterations measured");
                r.trials_s.push_back(std::accumulate(its.begin(), its.end(), 0.0) / double(its.size()));
                break;
              } catch (const std::exception& e) {
                if (attempt >= a.attempts) throw;
                std::cerr << "commsched bench: trial " << i + 1 << " of " << t.model << " / " << t.bandwidth << " / "
                          << w << " workers / " << t.policy << " failed (" << e.what() << "); running it again\n";
              }
            }
          r.predicted = sim::run_cell(spec, spec.models[mi], spec.bandwidths_bps[bi], w, p);
          r.real = r.predicted;
          r.real.iteration_s = std::accumulate(r.trials_s.begin(), r.trials_s.end(), 0.0) / double(a.trials);
          r.ci95_s = ci95(r.trials_s);
          std::cout << "commsched bench: " << t.model << " " << t.bandwidth << " " << w << " workers " << t.policy
                    << ": " << r.real.iteration_s * 1e3 << " ms real, " << r.predicted.iteration_s * 1e3
                    << " ms simulated (" << progress(rows.size() + 1, total_rows, t0) << ")" << std::endl;
          rows.push_back(std::move(r));
        }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  namespace fs = std::filesystem;
  const fs::path dir(a.out_dir);
  fs::create_directories(dir);
  std::vector<sim::CellResult> real;
  for (const Row& r : rows) real.push_back(r.real);
  for (size_t first = 0; first < real.size(); first += spec.policies.size())  // one cell: one row per policy
    sim::set_speedups_vs_wfbp(std::span(real).subspan(first, spec.policies.size()));
  write_file(dir / "results.csv", [&](std::ostream& o) { sim::write_csv(o, real); });
  write_file(dir / "results.json", [&](std::ostream& o) { sim::write_json(o, real); });
  write_file(dir / "results.md", [&](std::ostream& o) {
    sim::write_markdown(o, real, "Measured on a local PS cluster (links emulated; bounds from the simulator)");
  });
  write_file(dir / "cluster.csv", [&](std::ostream& o) {
    o << "model,bandwidth,workers,policy,knobs,cluster_ms,ci95_ms,sim_ms,sim_over_real,trials_ms\n";
    for (const Row& r : rows) {
      o << r.real.model << "," << r.bandwidth << "," << r.real.workers << "," << r.real.policy << ",\""
        << r.real.knobs << "\"," << r.real.iteration_s * 1e3 << "," << r.ci95_s * 1e3 << ","
        << r.predicted.iteration_s * 1e3 << "," << r.predicted.iteration_s / r.real.iteration_s << ",";
      for (size_t i = 0; i < r.trials_s.size(); ++i) o << (i ? " " : "") << r.trials_s[i] * 1e3;
      o << "\n";
    }
  });
  write_file(dir / "cluster.md", [&](std::ostream& o) {
    o << "| model | rate | workers | policy | real ms (95% CI, " << a.trials << " trials) | simulated ms | sim / real |\n"
      << "|---|---|---:|---|---:|---:|---:|\n";
    char line[512];
    for (const Row& r : rows) {
      std::snprintf(line, sizeof line, "| %s | %s | %d | %s | %.1f ± %.1f | %.1f | %.3f |\n", r.real.model.c_str(),
                    r.bandwidth.c_str(), r.real.workers, r.real.policy.c_str(), r.real.iteration_s * 1e3,
                    r.ci95_s * 1e3, r.predicted.iteration_s * 1e3, r.predicted.iteration_s / r.real.iteration_s);
      o << line;
    }
  });
  std::cout << "commsched bench: " << rows.size() << " cluster cells in " << secs << " s; wrote " << dir.string()
            << "/results.{csv,json,md} and cluster.{csv,md}\n";
  draw_plots(a, dir);
}

void run_bench(const BenchArgs& a, const ClusterTrial& cluster) {
  if (a.mode == "cluster") return run_cluster_bench(a, cluster);
  if (a.mode != "sim") throw InvalidArgument("--mode '" + a.mode + "' (allowed: sim, cluster)");
  sim::GridSpec spec = to_spec(a);
  std::optional<tbb::global_control> threads;
  if (a.threads > 0) threads.emplace(tbb::global_control::max_allowed_parallelism, size_t(a.threads));
  const auto t0 = std::chrono::steady_clock::now();
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
  // Timelines at the lowest bandwidth and first worker count, where scheduling matters most.
  const double bw = *std::min_element(spec.bandwidths_bps.begin(), spec.bandwidths_bps.end());
  for (const sim::ModelProfile& m : spec.models) {
    const auto tl = sim::run_timelines(spec, m, bw, spec.workers.front(), cells);
    write_file(dir / ("timeline-" + m.name + ".json"),
               [&](std::ostream& o) { sim::write_timelines(o, m.name, bw, spec.workers.front(), tl); });
  }
  std::cout << "commsched bench: " << cells.size() << " cells in " << secs << " s; wrote " << dir.string()
            << "/results.{csv,json,md} and timeline-*.json\n";
  draw_plots(a, dir);
}

}  // namespace

void add_bench_subcommand(CLI::App& app, ClusterTrial cluster) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* b = app.add_subcommand("bench", "Compare scheduling policies over models x bandwidths x workers");
  b->add_option("--mode", args->mode,
                "sim (discrete-event simulation) or cluster (each cell as a real local PS cluster, links emulated, "
                "beside the simulator's prediction)")
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
  b->add_option("--ring-alpha", args->ring_alpha, "all-reduce latency per ring step")->capture_default_str();
  b->add_option("--policies", args->policies, "policies to compare (registered: " + join_names(policy_names()) + ")")
      ->delimiter(',')->capture_default_str();
  for (size_t i = 0; i < kKnobCount; ++i)
    b->add_option("--" + std::string(kKnobs[i].grid_flag), args->grid[i], grid_help(kKnobs[i]))->delimiter(',');
  b->add_flag("--emulated-links", args->emulated_links,
              "PS: model COMMSCHED_EMULATE_RATE (each process's sends paced, receiving unlimited), for validation");
  b->add_option("--link-model", args->link_model,
                 "PS with every worker simulated, real NICs: 'fifo' (each link carries one message at a time, in "
                 "arrival order) or 'fair' (links shared max-min fairly among connections, as TCP shares a NIC)")
      ->capture_default_str();
  b->add_option("--ps-workers", args->ps_workers,
                 "PS: 'each' simulates every worker on its own (its own policy; the servers answer in arrival order; cost "
                 "grows with W), 'one' a single representative of symmetric workers (cost independent of W), 'auto' "
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
  b->callback([args, cluster = std::move(cluster)] { run_bench(*args, cluster); });
}

}  // namespace commsched
