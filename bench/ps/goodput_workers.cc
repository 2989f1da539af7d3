// ps_goodput's workers mode: W workers (each its own PsBackend, in this process) and one server per transport, every
// worker push_pulling at once; their goodputs summed.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "bench/ps/goodput_core.h"
#include "bench/ps/goodput_modes.h"
#include "comm_backends/ps/server.h"
#include "comm_backends/ps/transport.h"

namespace commsched::bench {
namespace {

// One server and `workers` workers over one transport; the workers are made in parallel (each waits for the
// rendezvous of all).
struct MultiPs {
  std::string name;
  std::thread server;
  std::vector<std::unique_ptr<PsBackend>> workers;
};

std::unique_ptr<MultiPs> start_multi_ps(const std::string& name, const std::string& transport, const char* ucx_tls,
                                        int port, int workers) {
  if (ucx_tls) setenv("UCX_TLS", ucx_tls, 1);
  PsConfig cfg = PsConfig::from_env();
  cfg.set("transport", transport);
  auto ps = std::make_unique<MultiPs>();
  ps->name = name;
  ps->server = std::thread([cfg, port, workers] { run_server(env_for(Role::server, "127.0.0.1", port, workers), cfg); });
  ps->workers.resize(static_cast<size_t>(workers));
  std::vector<std::thread> makers;
  for (int r = 0; r < workers; ++r)
    makers.emplace_back([&, r] {
      ps->workers[r] = std::make_unique<PsBackend>(env_for(Role::worker, "127.0.0.1", port, workers, r), cfg);
    });
  for (auto& t : makers) t.join();
  unsetenv("UCX_TLS");
  return ps;
}

// Every worker at once: rounds of a window of `part`-byte partitions, a message each; the sum of their goodputs.
double multi_goodput(MultiPs& ps, uint64_t part, uint64_t mib) {
  std::vector<double> rate(ps.workers.size());
  std::vector<std::thread> run;
  for (size_t r = 0; r < ps.workers.size(); ++r)
    run.emplace_back([&, r] { rate[r] = ps_round_goodput(*ps.workers[r], part, window_of(part), false, mib); });
  for (auto& t : run) t.join();
  double sum = 0;
  for (double v : rate) sum += v;
  return sum;
}

}  // namespace

int compare_workers(const std::vector<uint64_t>& sizes, const std::string& transports, int workers, uint64_t mib,
                    int reps) {
  const int base = 20000 + static_cast<int>(getpid() % 20000);
  std::vector<std::unique_ptr<MultiPs>> clusters;
  if (wanted(transports, "zmq")) clusters.push_back(start_multi_ps("zmq", "zmq", nullptr, base, workers));
  if (ps::ucx_built_in()) {
    if (wanted(transports, "shm")) clusters.push_back(start_multi_ps("ucx shm", "ucx", "sm,self", base + 1, workers));
    if (wanted(transports, "tcp")) clusters.push_back(start_multi_ps("ucx tcp", "ucx", "tcp", base + 2, workers));
  }
  std::printf("%d worker(s), 1 server: the workers' push_pull goodputs summed\n| partition |", workers);
  for (auto& c : clusters) std::printf(" %s MB/s |", c->name.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < clusters.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (uint64_t s : sizes) {
    std::vector<std::vector<double>> g(clusters.size());  // interleaved repetitions, median of each
    for (int r = 0; r < reps; ++r)
      for (size_t i = 0; i < clusters.size(); ++i) g[i].push_back(multi_goodput(*clusters[i], s, mib));
    std::printf("| %s |", size_name(s).c_str());
    for (auto& v : g) std::printf(" %.1f |", median(v) / 1e6);
    std::printf("\n");
    std::fflush(stdout);
  }
  for (auto& c : clusters) {
    for (auto& w : c->workers) w->shutdown();
    c->server.join();
  }
  return 0;
}

}  // namespace commsched::bench
