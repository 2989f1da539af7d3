// The scheduler against its baselines on all-reduce: a Context over Gloo per rank, ranks as processes on loopback, a
// model profile's compute emulated with sleeps by the emulated training loop of workload/synthetic_model (backward
// produces gradients last layer first; the next forward of layer L waits for L's gradients). Reports the mean
// iteration time per policy; policies alternate runs (A B A B ...) so drift on a shared machine hits them alike.
//
// Credit: --credit is the global credit of the order negotiation, given to bytescheduler only (the engine posts its
// credit knob to the global order on rank 0; per-rank credits deadlock a collective, see scheduler/global_order.h),
// so the baselines run without one, as their papers describe them.
//
//   engine_bench --profile workload/profiles/resnet50.json [--ranks 2] [--iters 8] [--warmup 2] [--repeats 2]
//                [--policies bytescheduler,wfbp] [--partition 4MiB] [--credit 16MiB] [--compute-scale 1]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "plugins/api/context.h"
#include "scheduler/policy_factory.h"
#include "plugins/launch/process_group.h"
#include "workload/profile.h"
#include "workload/synthetic_model.h"

using namespace commsched;

namespace {

struct Args {
  std::string profile;
  int ranks = 2, iters = 8, warmup = 2, repeats = 2;
  std::string policies = "bytescheduler,wfbp";
  std::string partition = "4MiB", credit = "16MiB";
  double compute_scale = 1.0;
  std::string policy, out;  // rank mode
  bool rank_process = false;
};

// One rank: a Context over Gloo (the cluster contract comes from the rank harness) runs the profile's emulated
// training loop (workload/synthetic_model, the one `commsched run` runs too); rank 0 writes the mean iteration time.
int run_rank(const Args& a) {
  const sim::ModelProfile model = sim::load_profile(a.profile);
  ContextOptions options;
  options.backend = "gloo";
  options.tune = false;
  EngineConfig cfg;
  cfg.set("policy", a.policy, "--policy");  // the option registry's parsers; errors name the flag
  cfg.set("partition_bytes", a.partition, "--partition");
  if (cfg.policy == PolicyKind::bytescheduler) cfg.set("credit_bytes", a.credit, "--credit");
  else cfg.knobs.credit_bytes = 0;
  cfg.partition_set = cfg.credit_set = true;
  options.engine_config = cfg;
  Context ctx(options);
  SyntheticOptions run;
  run.iterations = a.iters;
  run.warmup = a.warmup;
  run.compute_scale = a.compute_scale;
  run.op = Op::allreduce;
  const SyntheticResult r = run_synthetic_model(ctx.engine(), model, run);
  ctx.shutdown();
  if (!r.error.empty() || !r.data_ok) throw std::runtime_error("rank " + std::to_string(ctx.rank()) + ": " + r.error);
  if (ctx.rank() == 0) std::ofstream(a.out) << r.mean_s * 1e3 << "\n";
  return 0;
}

double launch(const Args& a, const std::string& policy) {
  const std::string out = "/tmp/commsched_engine_bench_" + std::to_string(::getpid()) + ".txt";
  std::remove(out.c_str());
  RankProcesses procs("/proc/self/exe",
                               {"--rank-process", "--profile", a.profile, "--policy", policy, "--out", out, "--iters",
                                std::to_string(a.iters), "--warmup", std::to_string(a.warmup), "--partition", a.partition,
                                "--credit", a.credit, "--compute-scale", std::to_string(a.compute_scale)},
                               a.ranks);
  for (const auto& e : procs.wait(std::chrono::seconds(600)))
    if (!e.exited || e.code != 0) throw std::runtime_error(policy + ": rank " + std::to_string(e.rank) + " failed");
  double ms = 0;
  std::ifstream(out) >> ms;
  std::remove(out.c_str());
  return ms;
}

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string*> strings{{"--profile", &a.profile}, {"--policies", &a.policies}, {"--partition", &a.partition},
                                              {"--credit", &a.credit},   {"--policy", &a.policy},     {"--out", &a.out}};
  std::map<std::string, int*> ints{{"--ranks", &a.ranks}, {"--iters", &a.iters}, {"--warmup", &a.warmup}, {"--repeats", &a.repeats}};
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--rank-process") {
      a.rank_process = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
    const std::string v = argv[++i];
    if (strings.count(k)) *strings[k] = v;
    else if (ints.count(k)) *ints[k] = std::stoi(v);
    else if (k == "--compute-scale") a.compute_scale = std::stod(v);
    else throw std::invalid_argument("unknown option " + k);
  }
  if (a.profile.empty()) throw std::invalid_argument("--profile is required");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.rank_process) return run_rank(a);
    std::vector<std::string> policies;
    std::stringstream ss(a.policies);
    for (std::string p; std::getline(ss, p, ',');) policies.push_back(p);
    std::map<std::string, std::vector<double>> ms;
    for (int r = 0; r < a.repeats; ++r)
      for (const auto& p : policies) ms[p].push_back(launch(a, p));
    const auto model = sim::load_profile(a.profile);
    std::printf("| model | policy | ranks | partition | credit | iteration ms (runs) | mean | vs %s |\n", policies[0].c_str());
    std::printf("|---|---|---:|---:|---:|---|---:|---:|\n");
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return s / static_cast<double>(v.size());
    };
    for (const auto& p : policies) {
      std::string runs;
      for (double x : ms[p]) runs += (runs.empty() ? "" : ", ") + std::to_string(x).substr(0, std::to_string(x).find('.') + 2);
      std::printf("| %s | %s | %d | %s | %s | %s | %.1f | %.2f |\n", model.name.c_str(), p.c_str(), a.ranks,
                  a.partition.c_str(), p == "bytescheduler" ? a.credit.c_str() : "-", runs.c_str(), mean(ms[p]), mean(ms[p]) / mean(ms[policies[0]]));
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "engine_bench: " << e.what() << "\n";
    return 1;
  }
}
