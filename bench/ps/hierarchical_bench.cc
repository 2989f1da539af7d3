// Plain parameter server against hierarchical mode (Gloo among the workers of each machine, one slice per worker
// through the PS), the same tensors through the same engine, measured side by side in one run.
//
//   hierarchical_bench [machines] [workers-per-machine] [tensors] [MiB-per-tensor] [steps-per-block] [blocks]
//                      (defaults: 2 2 8 1 5 5)
//
// A CPU stand-in on one host: every "machine" is a group of threads of this process, every worker and the server
// have their own ZeroMQ transport on loopback, and the local collective is Gloo over loopback TCP, so nothing here is
// the bandwidth hierarchy of real machines (NVLink inside, a NIC between). Set COMMSCHED_EMULATE_RATE (e.g. 1gbit) to
// give every PS endpoint (workers and server) a token-bucket link while the Gloo traffic stays unshaped: the shape
// of a cluster whose machines talk over a slower network than their workers do. Blocks alternate (plain, then
// hierarchical, ...) and the median block per side is reported, so load on a shared machine hits both alike.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/backend_registry.h"
#include "comm_backends/comm_backend.h"
#include "comm_backends/ps/server.h"
#include "plugins/launch/process_group.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"

using namespace commsched;
using Clock = std::chrono::steady_clock;

namespace {

int arg(int argc, char** argv, int i, int dflt) { return argc > i ? std::atoi(argv[i]) : dflt; }

// One server and every worker of one mode, each worker with its engine and its tensors.
struct Mode {
  std::string label;
  std::future<int> server;
  std::vector<std::shared_ptr<CommBackend>> backends;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::vector<std::vector<float>>> tensors;  // [worker][tensor]

  Mode(std::string name, bool hierarchical, int machines, int local, int count, uint64_t elements) : label(std::move(name)) {
    ClusterEnv base;
    base.num_workers = machines * local;
    base.num_servers = 1;
    base.root_port = free_loopback_port();
    base.local_size = local;
    base.timeout_s = 30;
    ::setenv("COMMSCHED_HIERARCHICAL", hierarchical ? "gloo" : "off", 1);
    ::setenv("COMMSCHED_HIERARCHICAL_PORT", std::to_string(free_loopback_port()).c_str(), 1);
    ClusterEnv server_env = base;
    server_env.role = Role::server;
    server_env.local_size = 1;
    server = std::async(std::launch::async, [server_env] { return run_server(server_env, PsConfig::from_env()); });
    backends.resize(static_cast<size_t>(base.num_workers));
    std::vector<std::thread> joins;
    for (int r = 0; r < base.num_workers; ++r)
      joins.emplace_back([&, r] {
        ClusterEnv e = base;
        e.rank = r;
        e.local_rank = r % local;
        backends[static_cast<size_t>(r)] = find_backend("ps")->make(e, EngineConfig{});
      });
    for (auto& j : joins) j.join();
    for (auto& b : backends) {
      EngineConfig c;
      c.knobs.partition_bytes = 1 << 20;
      c.knobs.credit_bytes = 4 << 20;
      engines.push_back(std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(c.knobs.credit_bytes), b, c));
      tensors.emplace_back(static_cast<size_t>(count), std::vector<float>(elements, 1.0f));
    }
  }

  // One training step on every worker at once: submit every tensor, end backward, wait. Returns seconds.
  double step() {
    const auto t0 = Clock::now();
    std::vector<std::thread> ws;
    for (size_t w = 0; w < engines.size(); ++w)
      ws.emplace_back([&, w] {
        Engine& e = *engines[w];
        for (size_t i = 0; i < tensors[w].size(); ++i) {
          Task t;
          t.name = "grad" + std::to_string(i);
          t.priority = static_cast<int32_t>(i);
          t.count = tensors[w][i].size();
          t.buffer.data = tensors[w][i].data();
          e.submit(std::move(t));
        }
        e.backward_done();
        const Status s = e.wait_all();
        if (!s.ok()) {
          std::fprintf(stderr, "%s worker %zu failed: %s\n", label.c_str(), w, s.message.c_str());
          std::exit(1);
        }
      });
    for (auto& t : ws) t.join();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  void close() {
    std::vector<std::thread> ws;
    for (auto& e : engines) ws.emplace_back([&e] { e->shutdown(); });
    for (auto& t : ws) t.join();
    server.wait();
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int machines = arg(argc, argv, 1, 2), local = arg(argc, argv, 2, 2), count = arg(argc, argv, 3, 8);
  const int mib = arg(argc, argv, 4, 1), steps = arg(argc, argv, 5, 5), blocks = arg(argc, argv, 6, 5);
  const uint64_t elements = static_cast<uint64_t>(mib) << 18;  // f32
  const char* rate = std::getenv("COMMSCHED_EMULATE_RATE");
  try {
    Mode plain("plain PS", false, machines, local, count, elements);
    Mode hier("hierarchical (gloo local)", true, machines, local, count, elements);
    plain.step();  // warm-up: connections, pools, first partition assignments
    hier.step();
    std::vector<double> per_plain, per_hier;
    for (int b = 0; b < blocks; ++b)
      for (Mode* m : {&plain, &hier}) {
        double s = 0;
        for (int i = 0; i < steps; ++i) s += m->step();
        (m == &plain ? per_plain : per_hier).push_back(s / steps);
      }
    const double bytes = static_cast<double>(count) * static_cast<double>(elements) * 4;
    std::printf("%d machines x %d workers, %d tensors x %d MiB f32 per step, PS links: %s\n", machines, local, count,
                mib, rate && *rate ? rate : "unshaped loopback");
    std::printf("| mode | step (median of %d blocks of %d) | per-worker tensor bytes / step time |\n|---|---|---|\n",
                blocks, steps);
    for (Mode* m : {&plain, &hier}) {
      const double t = median(m == &plain ? per_plain : per_hier);
      std::printf("| %s | %.1f ms | %.2f GB/s |\n", m->label.c_str(), t * 1e3, bytes / t / 1e9);
    }
    std::printf("hierarchical / plain step time: %.2f\n", median(per_hier) / median(per_plain));
    plain.close();
    hier.close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hierarchical_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
