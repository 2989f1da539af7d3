#include "plugins/cli/run_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "plugins/api/context.h"
#include "plugins/api/live_tuner.h"
#include "plugins/launch/launcher.h"
#include "scheduler/config.h"
#include "scheduler/policy_factory.h"
#include "simulator/row_label.h"
#include "workload/synthetic_model.h"

namespace commsched {
namespace {

// Engine options `run` sets on every engine, as option values by registry name; an empty value is not applied.
// Every engine option but the policy (--policies) and the trace file (--timeline-dir) gets a flag generated from the
// registry (scheduler/config.cc), so `run` and its workers take them all without a hand-written mapping. `run`
// starts from smaller knobs than the library so the scheduler's effect shows on small profiles.
std::map<std::string, std::string> run_engine_defaults() {
  std::map<std::string, std::string> m;
  for (const std::string& name : engine_option_table().names())
    if (name != "policy" && name != "timeline") m[name] = "";
  m["partition_bytes"] = "1MiB";
  m["credit_bytes"] = "4MiB";
  m["small_tensor_bytes"] = "64KiB";
  m["compression"] = "none";
  return m;
}

struct RunArgs {
  std::string model = "vgg16";
  std::string backend = "loopback";
  std::vector<std::string> policies = {std::string(PolicyKind::wfbp.name()), std::string(PolicyKind::bytescheduler.name())};
  int iterations = 10;
  int warmup = 2;
  double compute_scale = 1.0;
  int ranks = 1;
  int workers = 4;
  int servers = 2;
  std::string bandwidth = "25gbit";
  std::string latency = "50us";
  std::map<std::string, std::string> engine = run_engine_defaults();
  std::string timeline_dir = "out";
  bool tune = false;        // also run bytescheduler with the online auto-tuner
  std::string result_file;  // synthetic-worker only
};

const std::string& engine_value(const RunArgs& a, const std::string& name) { return a.engine.at(name); }

// A row of the comparison: a policy, optionally auto-tuned ("bytescheduler+tune", simulator/row_label.h).
bool is_tuned(const std::string& row) { return sim::parse_row(row).knobs == sim::KnobSource::tuned; }
std::string policy_of(const std::string& row) { return sim::parse_row(row).policy; }

EngineConfig engine_config(const RunArgs& a, const std::string& row) {  // the Timeline puts the rank in the file name
  EngineConfig c;
  for (const OptionInfo& o : engine_option_table().infos())
    if (auto it = a.engine.find(o.name); it != a.engine.end() && !it->second.empty()) c.set(o.name, it->second, o.flag());
  c.policy = parse_policy("--policies", policy_of(row));
  if (!a.timeline_dir.empty()) {
    std::filesystem::create_directories(a.timeline_dir);
    c.timeline_path = a.timeline_dir + "/timeline_" + row + "_rank{rank}.json";
  }
  c.validate();
  return c;
}

SyntheticOptions synthetic_options(const RunArgs& a) {
  SyntheticOptions o;
  o.iterations = a.iterations;
  o.warmup = a.warmup;
  o.compute_scale = a.compute_scale;
  return o;
}

// Defaults for `run`: shorter trials than the library's, so the main job tunes in about 60 iterations. Every
// COMMSCHED_TUNER_* variable still overrides them.
tuner::TunerOptions run_tuner_options(const RunArgs& a) {
  tuner::TunerOptions o;
  o.max_trials = 10;
  o.min_trials = 6;
  o.warmup_iterations = 1;
  o.window_iterations = 2;
  o.windows_per_trial = 2;
  if (!a.timeline_dir.empty()) o.csv_path = a.timeline_dir + "/tuner_trials.csv";
  return tuner::TunerOptions::from_env(o);
}

// What a row's Context is made of: the flags' engine configuration, and the online tuner for a "+tune" row.
ContextOptions context_options(const RunArgs& a, const std::string& row) {
  ContextOptions o;
  o.engine_config = engine_config(a, row);
  o.tune = is_tuned(row);
  if (is_tuned(row)) o.tuner = run_tuner_options(a);
  return o;
}

std::vector<uint64_t> tensor_bytes(const sim::ModelProfile& profile) {
  std::vector<uint64_t> sizes;
  for (const auto& t : profile.tensors) sizes.push_back(t.bytes());
  return sizes;
}

// Runs the profile on the Context's engine; with auto-tuning, the Context's tuner runs first (unmeasured) and the
// knobs it keeps are reported with the result.
nlohmann::json run_model(Context& ctx, const RunArgs& a, const sim::ModelProfile& profile) {
  SyntheticOptions o = synthetic_options(a);
  if (ctx.tuning()) {
    ctx.set_model(tensor_bytes(profile));  // keys the tuner's store of best configurations
    o.tuning_step = [&ctx](double seconds) {
      ctx.iteration_end_measured(seconds);
      return !ctx.tuning_finished();
    };
  }
  Engine& engine = ctx.engine();
  const SyntheticResult r = run_synthetic_model(engine, profile, o);
  nlohmann::json j = {{"mean_s", r.mean_s}, {"ci95_s", r.ci95_s}, {"median_s", r.median_s}, {"compute_s", r.compute_s},
                      {"bytes_per_iteration", r.bytes_per_iteration}, {"data_ok", r.data_ok},
                      {"tensors_fully_checked", r.tensors_fully_checked}, {"error", r.error},
                      {"iterations", r.iteration_s}};
  if (ctx.tuning()) {
    const Knobs k = engine.knobs();
    const int trials = ctx.tuner() ? ctx.tuner()->tuner().trials_done() : 0;
    j["tuning"] = {{"iterations", r.tuning_iterations}, {"trials", trials},
                   {"partition_bytes", k.partition_bytes}, {"credit_bytes", k.credit_bytes}};
  }
  return j;
}

// Loopback: ranks as threads of this process, each with its own modelled link.
nlohmann::json run_loopback(const RunArgs& a, const sim::ModelProfile& profile, const std::string& policy) {
  LinkModel link{parse_rate_bps("--bandwidth", a.bandwidth), parse_seconds("--latency", a.latency)};
  std::vector<std::unique_ptr<Context>> group = Context::loopback_group(a.ranks, link, context_options(a, policy));
  std::vector<nlohmann::json> results(a.ranks);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(a.ranks);
  for (int r = 0; r < a.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        results[r] = run_model(*group[r], a, profile);
        group[r]->shutdown();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < a.ranks; ++r)
    if (!errors[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
  return results[0];
}

std::string self_exe() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this executable through /proc/self/exe: " + ec.message());
  return p.string();
}

// Waits for the child `pid`; its exit code (128 + the signal where one ended it).
int wait_exit_code(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Where worker 0 of a cluster writes its result for this process to read (removed first: a stale file is no result).
std::string result_path(const std::string& policy) {
  const std::string result = (std::filesystem::temp_directory_path() /
                              ("commsched_run_" + std::to_string(::getpid()) + "_" + policy + ".json")).string();
  std::filesystem::remove(result);
  return result;
}

nlohmann::json read_result(const std::string& result) {
  std::ifstream in(result);
  if (!in) throw std::runtime_error("worker 0 wrote no result to " + result);
  nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(result);
  return j;
}

// PS: a local cluster of processes; worker 0 writes its result to a file this process reads.
nlohmann::json run_ps(const RunArgs& a, const std::string& policy) {
  const std::string result = result_path(policy);
  LaunchOptions lo;
  lo.workers = a.workers;
  lo.servers = a.servers;
  lo.emulate_rate = a.bandwidth;
  lo.command = {self_exe(), "synthetic-worker", "--model", a.model, "--policy", policy,
                "--iterations", std::to_string(a.iterations), "--warmup", std::to_string(a.warmup),
                "--compute-scale", std::to_string(a.compute_scale), "--timeline-dir", a.timeline_dir,
                "--result", result};
  for (const OptionInfo& o : engine_option_table().infos())  // every engine option given, under its generated flag
    if (auto it = a.engine.find(o.name); it != a.engine.end() && !it->second.empty())
      lo.command.insert(lo.command.end(), {o.flag(), it->second});
  // Each cluster is supervised from a fresh child process: the launcher blocks signals and reaps children, which is
  // simplest to keep from leaking into a second launch in the same process.
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int code = 1;
    try {
      code = launch_local_cluster(lo);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "commsched run: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  const int rc = wait_exit_code(pid);
  if (rc != 0) throw std::runtime_error("the local cluster for policy " + policy + " failed with exit code " + std::to_string(rc));
  return read_result(result);
}

// A trial over real shaped links: netns_trial.sh (beside this file; root) starts every server and worker in its own
// network namespace on a bridge, each host's link shaped with tbf both ways.
nlohmann::json run_netns(const ClusterTrialSpec& t) {
  const std::string script = COMMSCHED_NETNS_TRIAL_SCRIPT;
  if (!std::filesystem::exists(script))
    throw std::runtime_error("--links netns: no trial script at " + script + " (netns trials run from a source build)");
  const std::string result = result_path(t.policy);
  const std::vector<std::string> args = {script, self_exe(), t.model, t.bandwidth, std::to_string(t.workers),
                                         std::to_string(t.servers), t.policy, t.partition, t.credit, t.small_tensor,
                                         std::to_string(t.iterations), std::to_string(t.warmup), result};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::setenv("NETNS_AUTH", t.auth ? "on" : "off", 1);
    std::vector<char*> argv;
    for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    ::execv(script.c_str(), argv.data());
    std::perror(("commsched bench: cannot run " + script).c_str());
    ::_exit(127);
  }
  const int rc = wait_exit_code(pid);
  if (rc != 0) throw std::runtime_error(script + " (policy " + t.policy + ") failed with exit code " + std::to_string(rc));
  return read_result(result);
}

}  // namespace

std::vector<double> run_cluster_trial(const ClusterTrialSpec& t) {
  RunArgs a;
  a.model = t.model;
  a.workers = t.workers;
  a.servers = t.servers;
  a.bandwidth = t.bandwidth;
  a.iterations = t.iterations;
  a.warmup = t.warmup;
  a.engine["partition_bytes"] = t.partition;
  a.engine["credit_bytes"] = t.credit;
  a.engine["small_tensor_bytes"] = t.small_tensor;
  a.timeline_dir = "";
  const nlohmann::json r = t.links == "netns" ? run_netns(t) : run_ps(a, t.policy);
  if (!r["data_ok"].get<bool>() || !r["error"].get<std::string>().empty())
    throw std::runtime_error("policy " + t.policy + ": reduced data wrong or error '" + r["error"].get<std::string>() +
                             "'");
  return r["iterations"].get<std::vector<double>>();
}

namespace {

void print_row(const std::string& row, const nlohmann::json& r) {
  std::printf("  %-19s iteration %8.1f ms  ± %5.1f ms (95%%)   median %8.1f ms   data %s\n", row.c_str(),
              r["mean_s"].get<double>() * 1e3, r["ci95_s"].get<double>() * 1e3, r["median_s"].get<double>() * 1e3,
              r["data_ok"].get<bool>() ? "exact" : "WRONG");
  // Say exactly what "exact" covers (workload/synthetic_model.h).
  if (r.contains("tensors_fully_checked"))
    std::printf("  %-19s data check: every element of %llu tensor reductions (warm-up and trailing iterations); "
                "first element of each tensor in measured iterations\n", "",
                static_cast<unsigned long long>(r["tensors_fully_checked"].get<uint64_t>()));
  if (r.contains("tuning")) {
    const auto& t = r["tuning"];
    const uint64_t credit = t["credit_bytes"].get<uint64_t>();
    std::printf("  %-19s tuned in %d trials / %d iterations: partition %s, credit %s\n", "", t["trials"].get<int>(),
                t["iterations"].get<int>(), format_bytes(t["partition_bytes"].get<uint64_t>()).c_str(),
                credit == 0 ? "unlimited" : format_bytes(credit).c_str());
  }
}

void run_main(const RunArgs& a) {
  const std::string path = sim::resolve_profile_path(a.model);
  const sim::ModelProfile profile = sim::load_profile(path);
  std::printf("commsched run: model %s (%zu tensors, %s per iteration, compute %.1f ms), backend %s", profile.name.c_str(),
              profile.tensors.size(), format_bytes(profile.total_bytes()).c_str(),
              static_cast<double>(profile.compute_per_iteration()) * 1e-6 * a.compute_scale, a.backend.c_str());
  if (a.backend == "loopback")
    std::printf(" (%d rank%s as threads, modelled link %s, latency %s)\n", a.ranks, a.ranks > 1 ? "s" : "",
                a.bandwidth.c_str(), a.latency.c_str());
  else
    std::printf(" (%d workers, %d servers as processes on loopback, EMULATED link rate %s)\n", a.workers, a.servers,
                a.bandwidth.c_str());
  std::printf("  knobs: partition %s, credit %s, small-tensor fusion %s; %d measured iterations after %d warm-up\n",
              engine_value(a, "partition_bytes").c_str(), engine_value(a, "credit_bytes").c_str(),
              engine_value(a, "small_tensor_bytes").c_str(), a.iterations, a.warmup);
  std::vector<std::string> rows = a.policies;
  if (a.tune) rows.push_back(sim::row_name("bytescheduler", sim::KnobSource::tuned));
  std::map<std::string, nlohmann::json> results;
  for (const std::string& row : rows) {
    nlohmann::json r = a.backend == "ps" ? run_ps(a, row) : run_loopback(a, profile, row);
    if (!r["error"].get<std::string>().empty()) throw std::runtime_error(row + ": " + r["error"].get<std::string>());
    print_row(row, r);
    results[row] = r;
  }
  if (results.count("wfbp"))
    for (const std::string& row : rows)
      if (row != "wfbp")
        std::printf("  speedup of %s over wfbp: %.2fx\n", row.c_str(),
                    results["wfbp"]["mean_s"].get<double>() / results[row]["mean_s"].get<double>());
  if (!a.timeline_dir.empty()) std::printf("  timelines: %s/timeline_<policy>_rank<r>.json (open in Perfetto)\n", a.timeline_dir.c_str());
  for (auto& [policy, r] : results)
    if (!r["data_ok"].get<bool>()) throw std::runtime_error(policy + ": reduced data did not match the expected sums");
}

// One flag per engine option of the registry: its name with dashes, and its aliases ("--partition"); the help text is
// the registry's doc and allowed values; the default shown is `run`'s when it has one, else the library's.
void add_engine_flags(CLI::App* s, RunArgs& a) {
  for (const OptionInfo& o : engine_option_table().infos()) {
    auto it = a.engine.find(o.name);
    if (it == a.engine.end()) continue;
    std::string names = o.flag();
    for (const std::string& alias : o.aliases) names += ",--" + alias;
    std::replace(names.begin(), names.end(), '_', '-');
    const std::string shown = it->second.empty() ? o.default_value : it->second;
    s->add_option(names, it->second, o.doc + " (" + o.env + "; " + o.allowed + ") [default: " + shown + "]");
  }
}

// With tuning on, the tuner's warm start simulates this profile's compute (scaled as run) on the cluster and the link
// the Context measured at startup, or estimated (the emulated rate) where the probe is off: the plugin's warm start,
// with the compute known instead of measured.
void set_compute_profile(Context& ctx, const RunArgs& a, sim::ModelProfile profile) {
  if (!ctx.tuning()) return;
  for (sim::LayerProfile& l : profile.layers) {
    l.forward = static_cast<Nanos>(double(l.forward) * a.compute_scale);
    l.backward = static_cast<Nanos>(double(l.backward) * a.compute_scale);
  }
  ctx.set_compute_profile(std::move(profile));
}

void add_common(CLI::App* s, RunArgs& a) {
  s->add_option("--model", a.model, "profile name (workload/profiles) or path to a profile JSON")->capture_default_str();
  s->add_option("--iterations", a.iterations, "measured iterations")->check(CLI::PositiveNumber)->capture_default_str();
  s->add_option("--warmup", a.warmup, "warm-up iterations (not measured)")->check(CLI::NonNegativeNumber)->capture_default_str();
  s->add_option("--compute-scale", a.compute_scale, "multiply profiled compute times")->check(CLI::PositiveNumber)->capture_default_str();
  add_engine_flags(s, a);
  s->add_option("--timeline-dir", a.timeline_dir, "folder for Chrome traces (empty: none)")->capture_default_str();
  s->add_flag("--tune", a.tune, "also run bytescheduler with the online auto-tuner (COMMSCHED_TUNER_* apply)");
}

}  // namespace

void add_run_subcommand(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* s = app.add_subcommand("run", "run a model profile with WFBP and with the scheduler; print both and the speedup");
  add_common(s, *a);
  s->add_option("--backend", a->backend, "loopback (ranks as threads) or ps (local parameter-server cluster)")
      ->check(CLI::IsMember({"loopback", "ps"}))->capture_default_str();
  s->add_option("--policies", a->policies, "policies to run")->delimiter(',')->capture_default_str();
  s->add_option("--ranks", a->ranks, "loopback: ranks (threads)")->check(CLI::PositiveNumber)->capture_default_str();
  s->add_option("-w,--workers", a->workers, "ps: worker processes")->check(CLI::PositiveNumber)->capture_default_str();
  s->add_option("-s,--servers", a->servers, "ps: server processes")->check(CLI::PositiveNumber)->capture_default_str();
  s->add_option("--bandwidth", a->bandwidth, "link rate per rank (loopback: modelled; ps: emulated)")->capture_default_str();
  s->add_option("--latency", a->latency, "loopback: modelled latency per message")->capture_default_str();
  s->callback([a] { run_main(*a); });
}

void add_synthetic_worker_subcommand(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto policy = std::make_shared<std::string>("bytescheduler");
  CLI::App* s = app.add_subcommand("synthetic-worker", "one worker of `run --backend ps` (environment contract)");
  s->group("");  // hidden: started by the launcher
  add_common(s, *a);
  s->add_option("--policy", *policy, "policy")->capture_default_str();
  s->add_option("--result", a->result_file, "rank 0 writes its result here");
  s->callback([a, policy] {
    const sim::ModelProfile profile = sim::load_profile(sim::resolve_profile_path(a->model));
    ContextOptions options = context_options(*a, *policy);
    options.backend = "ps";  // the cluster contract (COMMSCHED_*) comes from the launcher
    Context ctx(options);
    set_compute_profile(ctx, *a, profile);
    const nlohmann::json r = run_model(ctx, *a, profile);
    ctx.shutdown();
    if (const std::string error = r["error"].get<std::string>(); !error.empty()) {
      std::cerr << "commsched worker " << ctx.rank() << ": " << error << std::endl;
      throw CLI::RuntimeError(1);
    }
    if (ctx.rank() == 0 && !a->result_file.empty()) {
      std::ofstream out(a->result_file);
      out << r.dump() << "\n";
    }
  });
}

}  // namespace commsched
