// `commsched bench --mode cluster`: every cell run as a real local parameter-server cluster (links emulated by the
// transport's token bucket, or real shaped links in network namespaces), --trials times, beside the simulator's
// prediction for the same cell and knobs, once with every worker simulated and once with symmetric workers.
// --resimulate runs no cluster: it predicts the real cells of an earlier cluster.csv again.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <utility>

#include "base/cpu_usage.h"
#include "base/stats.h"
#include "simulator/bench_args.h"
#include "simulator/report.h"

namespace commsched::bench {
namespace {

// One real cell beside its two predictions.
struct Row {
  Row(std::string model_, std::string bandwidth_, std::string policy_, int workers_, int servers_)
      : model(std::move(model_)), bandwidth(std::move(bandwidth_)), policy(std::move(policy_)), workers(workers_),
        servers(servers_) {}
  std::string model, bandwidth, policy;
  int workers = 0, servers = 0;
  std::vector<double> trials_s;
  MeanCi real;                // of the trial means, seconds
  // What the trials used of the machine (means over trials; -1 where unknown, e.g. an older cluster.csv): the share of
  // all cores busy (the kernel's packet work included) and the cores the cluster's processes used. A cell whose
  // machine was near full measured the CPU as well as the links, which the simulator does not model.
  double machine_busy = -1, trial_cores = -1;
  sim::CellResult each, one;  // predicted: every worker simulated; one representative of symmetric workers
};

void check_cluster_args(const BenchArgs& a, const ClusterTrial& trial) {
  if (!trial && a.resimulate.empty())
    throw InvalidArgument("--mode cluster: this executable cannot launch clusters; use `commsched bench --mode cluster` "
                          "(or --resimulate an earlier cluster.csv)");
  if (a.network != "ps") throw InvalidArgument("--mode cluster: only --network ps runs as a local cluster");
  if (a.trials < 1 || a.trial_iterations < 1 || a.trial_warmup < 0 || a.attempts < 1)
    throw InvalidArgument("--mode cluster: need --trials >= 1, --trial-iterations >= 1, --trial-warmup >= 0, "
                          "--attempts >= 1");
  if (a.tune > 0) throw InvalidArgument("--tune: simulation only (cluster mode runs the knobs it is given)");
  if (a.compression != "none")
    throw InvalidArgument("--compression '" + a.compression + "': simulation only (cluster mode runs uncompressed)");
  for (size_t i = 0; i < kKnobCount; ++i)
    if (a.grid[i].size() > 1)
      throw InvalidArgument("--" + std::string(kKnobs[i].grid_flag) + ": cluster mode runs one knob setting, got " +
                            std::to_string(a.grid[i].size()));
}

// The simulator's view of the runs: one knob setting (the first value of each knob flag; 1 MiB partitions, credit 4x,
// 64 KiB small-tensor fusion if not given) and the links as the trials have them.
struct Predictor {
  sim::GridSpec each, one;
  double efficiency = 1;  // payload share of the link rate
  std::string profiles_dir;
  std::map<std::string, sim::ModelProfile> profiles;

  explicit Predictor(const BenchArgs& a) : profiles_dir(a.profiles_dir) {
    BenchArgs s = a;
    s.models = {};  // loaded per row
    auto first_or = [&](std::string_view knob, const char* fallback) {
      std::vector<std::string>& given = s.grid[size_t(knob_index(knob))];
      given = {given.empty() ? fallback : given.front()};
    };
    first_or("partition_bytes", "1MiB");
    first_or("credit_bytes", "4");
    first_or("small_tensor_bytes", "64KiB");
    const bool netns = a.links == "netns";
    s.emulated_links = !netns;
    s.ps_workers = "each";
    each = to_spec(s);
    s.ps_workers = "one";
    s.link_model = "fifo";  // the symmetric model has FIFO links only
    one = to_spec(s);
    efficiency = a.link_efficiency > 0 ? a.link_efficiency : netns ? 1448.0 / 1514.0 : 1.0;
  }
  uint64_t knob(std::string_view name) const { return uint64_t(each.grid(name).front()); }
  uint64_t credit() const { return std::max<uint64_t>(1, uint64_t(double(knob("partition_bytes")) * each.grid("credit_bytes").front())); }

  void predict(Row& r) {
    auto it = profiles.find(r.model);
    if (it == profiles.end())
      it = profiles.emplace(r.model, sim::load_profile(sim::resolve_profile_path(r.model, {profiles_dir}))).first;
    const double bps = parse_rate_bps("--bandwidths", r.bandwidth) * efficiency;
    const PolicyKind p = parse_policy("--policies", r.policy);
    each.servers = one.servers = r.servers;
    r.each = sim::run_cell(each, it->second, bps, r.workers, p);
    r.one = sim::run_cell(one, it->second, bps, r.workers, p);
  }
};

// One trial's mean iteration and what it used of the machine.
struct TrialResult {
  double mean_s = 0;
  std::optional<double> machine_busy;
  double cores = 0;
};

// One run of a cell, started again on failure up to --attempts times; the mean of its measured iterations.
TrialResult run_trial(const BenchArgs& a, const ClusterTrial& trial, const ClusterTrialSpec& t, int index) {
  for (int attempt = 1;; ++attempt) {
    try {
      const CpuMeter cpu;
      const std::vector<double> its = trial(t);
      if (its.empty()) throw std::runtime_error("no iterations measured");
      return {std::accumulate(its.begin(), its.end(), 0.0) / double(its.size()), cpu.machine_busy(),
              cpu.children_cores()};
    } catch (const std::exception& e) {
      if (attempt >= a.attempts) throw;
      std::cerr << "commsched bench: trial " << index + 1 << " of " << t.model << " / " << t.bandwidth << " / "
                << t.workers << " workers / " << t.policy << " failed (" << e.what() << "); running it again\n";
    }
  }
}

// "machine 85% busy, cluster 1.62 cores": what a reader needs to tell a network measurement from a CPU one. A machine
// busier than kCpuBoundShare of its cores is flagged: its processes queued for cores the simulator assumes free.
constexpr double kCpuBoundShare = 0.8;
std::string cpu_text(const Row& r) {
  if (r.machine_busy < 0) return "not measured";
  char text[96];
  std::snprintf(text, sizeof text, "machine %.0f%% busy, cluster %.2f cores%s", r.machine_busy * 100, r.trial_cores,
                r.machine_busy >= kCpuBoundShare ? " (CPU-bound)" : "");
  return text;
}

// Runs the cell's trials into `r`: the iteration times and the machine's use, averaged.
void add_trials(const BenchArgs& a, const ClusterTrial& trial, const ClusterTrialSpec& t, Row& r) {
  double busy = 0, cores = 0;
  int busy_known = 0;
  for (int i = 0; i < a.trials; ++i) {
    const TrialResult tr = run_trial(a, trial, t, i);
    r.trials_s.push_back(tr.mean_s);
    cores += tr.cores;
    if (tr.machine_busy) busy += *tr.machine_busy, ++busy_known;
  }
  r.real = mean_ci95(r.trials_s);
  r.trial_cores = cores / a.trials;
  if (busy_known) r.machine_busy = busy / busy_known;
}

std::vector<Row> run_cells(const BenchArgs& a, const ClusterTrial& trial, Predictor& predictor) {
  std::vector<Row> rows;
  const size_t total = a.models.size() * a.bandwidths.size() * a.workers.size() * a.policies.size();
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& model : a.models)
    for (const std::string& bandwidth : a.bandwidths)
      for (int w : a.workers)
        for (const std::string& policy : a.policies) {
          Row r(model, bandwidth, policy, w, a.servers > 0 ? a.servers : w);
          ClusterTrialSpec t{model, bandwidth, w, r.servers, policy,
                             std::to_string(predictor.knob("partition_bytes")), std::to_string(predictor.credit()),
                             std::to_string(predictor.knob("small_tensor_bytes")), a.trial_iterations,
                             a.trial_warmup, a.links, a.auth == "on"};
          add_trials(a, trial, t, r);
          predictor.predict(r);
          std::cout << "commsched bench: " << model << " " << bandwidth << " " << w << " workers " << policy << ": "
                    << r.real.mean * 1e3 << " ms real, " << r.each.iteration_s * 1e3 << " ms simulated, "
                    << r.one.iteration_s * 1e3 << " ms symmetric; " << cpu_text(r) << " ("
                    << progress(rows.size() + 1, total, t0) << ")" << std::endl;
          rows.push_back(std::move(r));
        }
  return rows;
}

// The fields of one CSV line; a quoted field may hold commas ("partition 1 MiB, credit 4 MiB").
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) out.emplace_back();
    else if (c != '\r') out.back() += c;
  }
  return out;
}

// The real cells of an earlier cluster.csv, their predictions made again.
std::vector<Row> resimulate(const BenchArgs& a, Predictor& predictor) {
  std::ifstream in(a.resimulate);
  std::string line;
  if (!in || !std::getline(in, line)) throw InvalidArgument("--resimulate: cannot read '" + a.resimulate + "'");
  std::map<std::string, size_t> col;
  for (const std::string& name : csv_fields(line)) col.emplace(name, col.size());
  for (const char* need : {"model", "bandwidth", "workers", "servers", "policy", "cluster_ms", "ci95_ms", "trials_ms"})
    if (!col.count(need)) throw InvalidArgument("--resimulate: '" + a.resimulate + "' has no column " + need);
  std::vector<Row> rows;
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const std::vector<std::string> f = csv_fields(line);
    if (f.size() != col.size())
      throw InvalidArgument("--resimulate: " + a.resimulate + " line " + std::to_string(n) + " has " +
                            std::to_string(f.size()) + " fields, the header " + std::to_string(col.size()));
    const std::string where = "--resimulate (" + a.resimulate + " line " + std::to_string(n) + ")";
    Row r(f[col["model"]], f[col["bandwidth"]], f[col["policy"]], int(parse_double(where, f[col["workers"]], 1, 1e6)),
          int(parse_double(where, f[col["servers"]], 1, 1e6)));
    std::istringstream trials(f[col["trials_ms"]]);
    for (double ms; trials >> ms;) r.trials_s.push_back(ms / 1e3);
    r.real = {parse_double(where, f[col["cluster_ms"]], 0, 1e12) / 1e3, std::atof(f[col["ci95_ms"]].c_str()) / 1e3};
    if (col.count("machine_busy") && col.count("trial_cores")) {  // absent before December 2026's CPU accounting
      r.machine_busy = std::atof(f[col["machine_busy"]].c_str());
      r.trial_cores = std::atof(f[col["trial_cores"]].c_str());
    }
    predictor.predict(r);
    rows.push_back(std::move(r));
  }
  return rows;
}

void write_cluster_csv(std::ostream& o, const std::vector<Row>& rows) {
  o << "model,bandwidth,workers,servers,policy,knobs,cluster_ms,ci95_ms,sim_ms,sim_over_real,sim_one_ms,"
       "sim_one_over_real,trials_ms,machine_busy,trial_cores\n";
  for (const Row& r : rows) {
    o << r.model << "," << r.bandwidth << "," << r.workers << "," << r.servers << "," << r.policy << ",\""
      << r.each.knobs << "\"," << r.real.mean * 1e3 << "," << r.real.half_width * 1e3 << ","
      << r.each.iteration_s * 1e3 << "," << r.each.iteration_s / r.real.mean << "," << r.one.iteration_s * 1e3 << ","
      << r.one.iteration_s / r.real.mean << ",";
    for (size_t i = 0; i < r.trials_s.size(); ++i) o << (i ? " " : "") << r.trials_s[i] * 1e3;
    o << "," << r.machine_busy << "," << r.trial_cores << "\n";
  }
}

void write_cluster_md(std::ostream& o, const std::vector<Row>& rows) {
  o << "| model | rate | workers | servers | policy | real ms (95% CI) | sim ms, each worker | sim / real "
       "| sim ms, symmetric | sim / real | CPU |\n|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|\n";
  char line[512];
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "| %s | %s | %d | %d | %s | %.1f ± %.1f | %.1f | %.3f | %.1f | %.3f | %s |\n",
                  r.model.c_str(), r.bandwidth.c_str(), r.workers, r.servers, r.policy.c_str(), r.real.mean * 1e3,
                  r.real.half_width * 1e3, r.each.iteration_s * 1e3, r.each.iteration_s / r.real.mean,
                  r.one.iteration_s * 1e3, r.one.iteration_s / r.real.mean, cpu_text(r).c_str());
    o << line;
  }
}

// The measured cells in the simulator's formats too (results.{csv,json,md}, speedups over WFBP filled in).
void write_results(const BenchArgs& a, const std::vector<Row>& rows, const std::filesystem::path& dir) {
  std::vector<sim::CellResult> real;
  for (const Row& r : rows) {
    real.push_back(r.each);
    real.back().iteration_s = r.real.mean;
  }
  for (size_t first = 0; first < real.size(); first += a.policies.size())  // one cell: one row per policy
    sim::set_speedups_vs_wfbp(std::span(real).subspan(first, a.policies.size()));
  write_file(dir / "results.csv", [&](std::ostream& o) { sim::write_csv(o, real); });
  write_file(dir / "results.json", [&](std::ostream& o) { sim::write_json(o, real); });
  write_file(dir / "results.md", [&](std::ostream& o) {
    sim::write_markdown(o, real, "Measured on a local PS cluster (links " + a.links + "; bounds from the simulator)");
  });
}

}  // namespace

void run_cluster_bench(const BenchArgs& a, const ClusterTrial& trial) {
  check_cluster_args(a, trial);
  Predictor predictor(a);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Row> rows = a.resimulate.empty() ? run_cells(a, trial, predictor) : resimulate(a, predictor);
  if (rows.empty()) throw InvalidArgument("--mode cluster: no cells (" + a.resimulate + " has no rows)");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::filesystem::path dir(a.out_dir);
  std::filesystem::create_directories(dir);
  write_file(dir / "cluster.csv", [&](std::ostream& o) { write_cluster_csv(o, rows); });
  write_file(dir / "cluster.md", [&](std::ostream& o) { write_cluster_md(o, rows); });
  if (a.resimulate.empty()) write_results(a, rows, dir);
  std::cout << "commsched bench: " << rows.size() << " cluster cells in " << secs << " s; wrote " << dir.string() << "/"
            << (a.resimulate.empty() ? "results.{csv,json,md} and " : "") << "cluster.{csv,md}\n";
  if (a.resimulate.empty()) draw_plots(a, dir);
}

}  // namespace commsched::bench
