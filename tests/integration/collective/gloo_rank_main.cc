// One rank of the multi-process Gloo tests, started by gloo_multiprocess_test with the ClusterEnv variables set.
//
//   gloo_rank random <seed> <iterations>   random tasks submitted in a rank-specific order; exits 0 when every result is
//                                          exact
//   gloo_rank engine <seed> <iterations> <policy>
//                                          the same through the scheduler Engine (partitioning, credit, policy)
//   gloo_rank kill <seed> <victim>         one clean iteration, then the victim SIGKILLs itself; every survivor must
//                                          see its pending work fail with peer_lost naming the victim within 10 s
//   gloo_rank hang <seed> <victim>         the same, but the victim SIGSTOPs itself (hung, connections open): only
//                                          its silence can tell, within 10 s with the default COMMSCHED_TIMEOUT
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "comm_backends/gloo/gloo_backend.h"
#include "scheduler/engine.h"
#include "scheduler/policy_factory.h"
#include "scheduler/completion_waiter.h"
#include "tests/integration/collective/workload.h"

using namespace commsched;
using commsched::testing::WorkloadTask;

namespace {

using Outcome = CompletionWaiter;

// Submits every partition of `tasks` (batches of one or two partitions) in a rank-specific random order and waits.
// Returns false when the wait times out.
bool run_iteration(GlooBackend& backend, std::vector<std::unique_ptr<WorkloadTask>>& tasks, uint64_t order_seed,
                   Outcome& out, std::chrono::seconds limit) {
  std::vector<std::vector<PartitionView>> batches;
  std::mt19937_64 rng(order_seed);
  for (auto& t : tasks)
    for (uint32_t i = 0; i < t->parts.size();) {
      const uint32_t n = std::min<uint32_t>(1 + rng() % 2, static_cast<uint32_t>(t->parts.size()) - i);
      std::vector<PartitionView> batch;
      for (uint32_t k = i; k < i + n; ++k) batch.push_back({&t->desc, k, t->parts[k].offset, t->parts[k].bytes});
      batches.push_back(std::move(batch));
      i += n;
    }
  std::shuffle(batches.begin(), batches.end(), rng);
  out.reset();
  for (auto& b : batches) backend.start(std::move(b), out.callback());
  out.wait(limit);
  return out.outstanding() == 0;
}

int scenario_random(const ClusterEnv& env, uint64_t seed, int iterations) {
  GlooBackend backend(env);
  Outcome out;
  for (int it = 0; it < iterations; ++it) {
    auto tasks = testing::make_workload(seed, 24, 40000, 16 << 10, env.num_workers, static_cast<uint64_t>(it));
    testing::fill_inputs(tasks, env.rank);
    if (!run_iteration(backend, tasks, seed * 1000 + env.rank * 7 + it, out, std::chrono::seconds(60))) {
      std::cerr << "rank " << env.rank << ": iteration " << it << " did not finish within 60 s\n";
      return 2;
    }
    if (!out.failures().empty()) {
      std::cerr << "rank " << env.rank << ": iteration " << it << " failed: " << out.failures().front().message << "\n";
      return 3;
    }
    if (std::string bad = testing::check_results(tasks, env.num_workers); !bad.empty()) {
      std::cerr << "rank " << env.rank << ": iteration " << it << " wrong result: " << bad << "\n";
      return 4;
    }
  }
  const auto stats = backend.negotiation_stats();
  std::cout << "rank " << env.rank << " ok: " << stats.submitted << " partitions, " << stats.cached_reports
            << " reported by cache id, " << stats.groups << " collectives, " << stats.orders << " order messages\n";
  backend.shutdown();
  return 0;
}

int scenario_engine(const ClusterEnv& env, uint64_t seed, int iterations, const std::string& policy) {
  EngineConfig cfg;
  cfg.policy = parse_policy("policy", policy);
  cfg.knobs.partition_bytes = 16 << 10;
  // A small credit: the engine hands it to the backend (capabilities: global_order), which keeps it as the global credit of the
  // order negotiation; per-rank credits would deadlock (see scheduler/global_order.h).
  cfg.knobs.credit_bytes = 128 << 10;
  // Rank 0's coordinator runs the same policy over the partitions ready on every rank.
  collective::CollectiveOptions collective = collective::CollectiveOptions::from_env();
  collective.policy = cfg;
  Engine engine(make_policy(cfg), std::make_shared<GlooBackend>(env, collective), cfg);
  for (int it = 0; it < iterations; ++it) {
    auto tasks = testing::make_workload(seed, 24, 40000, cfg.knobs.partition_bytes, env.num_workers, static_cast<uint64_t>(it));
    testing::fill_inputs(tasks, env.rank);
    std::vector<size_t> order(tasks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed * 1000 + env.rank * 7 + it));
    std::mutex mu;
    std::vector<std::string> failures;
    for (size_t i : order) {
      const TaskDesc& d = tasks[i]->desc;
      Task t{d.name, d.priority, d.op, d.dtype, d.count, d.buffer, d.root, [&mu, &failures](const Status& st) {
               std::lock_guard lock(mu);
               if (!st.ok()) failures.push_back(st.message);
             }, {}};
      engine.submit(std::move(t));
    }
    engine.backward_done();
    if (!engine.wait_all_for(std::chrono::seconds(60))) {
      std::cerr << "rank " << env.rank << ": engine iteration " << it << " did not finish within 60 s\n";
      return 2;
    }
    if (!failures.empty()) {
      std::cerr << "rank " << env.rank << ": engine iteration " << it << " failed: " << failures.front() << "\n";
      return 3;
    }
    if (std::string bad = testing::check_results(tasks, env.num_workers); !bad.empty()) {
      std::cerr << "rank " << env.rank << ": engine iteration " << it << " wrong result: " << bad << "\n";
      return 4;
    }
  }
  std::cout << "rank " << env.rank << " ok through the engine (" << policy << "): "
            << engine.stats().partitions_dispatched << " partitions dispatched\n";
  engine.shutdown();
  return 0;
}

int scenario_kill(const ClusterEnv& env, uint64_t seed, int victim, int signal) {
  GlooBackend backend(env);
  Outcome out;
  auto first = testing::make_workload(seed, 8, 4000, 16 << 10, env.num_workers, 0);
  testing::fill_inputs(first, env.rank);
  if (!run_iteration(backend, first, seed + env.rank, out, std::chrono::seconds(60)) || !out.failures().empty()) {
    std::cerr << "rank " << env.rank << ": the clean iteration failed\n";
    return 2;
  }
  // SIGKILL: a crash, no goodbye, sockets closed by the kernel. SIGSTOP: a hang, sockets open and silent.
  if (env.rank == victim) ::raise(signal);
  auto second = testing::make_workload(seed, 8, 4000, 16 << 10, env.num_workers, 1);
  testing::fill_inputs(second, env.rank);
  const auto t0 = std::chrono::steady_clock::now();
  if (!run_iteration(backend, second, seed + env.rank + 1, out, std::chrono::seconds(10))) {
    std::cerr << "rank " << env.rank << ": pending work did not fail within 10 s after the victim died\n";
    return 2;
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string victim_name = "rank " + std::to_string(victim);
  for (const Status& st : out.failures())
    if (st.code != Status::Code::peer_lost || st.message.find(victim_name) == std::string::npos) {
      std::cerr << "rank " << env.rank << ": expected peer_lost naming " << victim_name << ", got code "
                << static_cast<int>(st.code) << ": " << st.message << "\n";
      return 3;
    }
  if (out.failures().empty()) {
    std::cerr << "rank " << env.rank << ": work succeeded although " << victim_name << " was dead\n";
    return 3;
  }
  std::cout << "rank " << env.rank << " saw after " << waited << " s: " << out.failures().front().message << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: gloo_rank random|kill|engine <seed> <iterations|victim> [policy]\n";
    return 64;
  }
  try {
    const ClusterEnv env = ClusterEnv::from_env();
    // GLOO_TEST_LATE_RANK=R:S: rank R starts S seconds after the others (a slow framework import, a busy host).
    if (const char* late = std::getenv("GLOO_TEST_LATE_RANK")) {
      const std::string spec = late;
      if (std::stoi(spec.substr(0, spec.find(':'))) == env.rank)
        std::this_thread::sleep_for(std::chrono::duration<double>(std::stod(spec.substr(spec.find(':') + 1))));
    }
    const std::string scenario = argv[1];
    const uint64_t seed = std::stoull(argv[2]);
    const int arg = std::stoi(argv[3]);
    int rc = 64;
    if (scenario == "random") rc = scenario_random(env, seed, arg);
    else if (scenario == "kill") rc = scenario_kill(env, seed, arg, SIGKILL);
    else if (scenario == "hang") rc = scenario_kill(env, seed, arg, SIGSTOP);
    else if (scenario == "engine" && argc > 4) rc = scenario_engine(env, seed, arg, argv[4]);
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "rank error: " << e.what() << "\n";
    return 1;
  }
}
