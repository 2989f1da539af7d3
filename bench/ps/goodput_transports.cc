// ps_goodput's transports and fused modes: one server (a thread) and one worker on loopback per transport, side by
// side with raw TCP echo, a memcpy loop and UCX's perftest ceiling (transports), or fused batches against a batch per
// partition (fused).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "bench/ps/goodput_core.h"
#include "bench/ps/goodput_modes.h"
#include "bench/ps/perftest_ceiling.h"
#include "bench/ps/raw_tcp.h"
#include "comm_backends/ps/server.h"
#include "comm_backends/ps/transport.h"

namespace commsched::bench {
namespace {

// A memory copy of the same bytes, partition by partition, through a window of buffers like the PS run's.
double memcpy_rate(uint64_t part, uint64_t mib) {
  const uint64_t total = total_bytes(part, mib);
  const uint64_t n = std::min<uint64_t>(window_of(part), std::max<uint64_t>(2, (256ull << 20) / part));
  std::vector<std::vector<char>> src(n, std::vector<char>(part, 'x')), dst(n, std::vector<char>(part, 0));
  const auto t0 = Clock::now();
  uint64_t i = 0;
  for (uint64_t done = 0; done < total; done += part, ++i) std::memcpy(dst[i % n].data(), src[i % n].data(), part);
  const double secs = seconds_since(t0);
  volatile char sink = dst[0][part - 1];
  (void)sink;
  return static_cast<double>(total) / secs;
}

// One server (a thread) and one worker on loopback over one transport.
struct LocalPs {
  std::string name;
  std::string tls;  // UCX_TLS of a UCX cluster; empty for ZeroMQ
  std::thread server;
  std::unique_ptr<PsBackend> worker;
};

std::unique_ptr<LocalPs> start_local_ps(const std::string& name, const std::string& transport, const char* ucx_tls,
                                        int port) {
  // UCX reads UCX_TLS when a transport is made; both ends are made before the next cluster changes it.
  if (ucx_tls) setenv("UCX_TLS", ucx_tls, 1);
  PsConfig cfg = PsConfig::from_env();
  cfg.set("transport", transport);
  auto ps = std::make_unique<LocalPs>();
  ps->name = name;
  ps->tls = ucx_tls ? ucx_tls : "";
  ps->server = std::thread([cfg, port] { run_server(env_for(Role::server, "127.0.0.1", port), cfg); });
  ps->worker = std::make_unique<PsBackend>(env_for(Role::worker, "127.0.0.1", port), cfg);
  if (ps_goodput(*ps->worker, 64 << 10, 1) <= 0) throw std::runtime_error(name + ": warm-up push_pull failed");
  unsetenv("UCX_TLS");
  return ps;
}

// One size's medians: each cluster, UCX's perftest over each UCX cluster's UCX_TLS (0: not measured), raw echo,
// memcpy.
struct TransportRow {
  uint64_t size = 0;
  std::vector<double> ps, ceiling;
  double echo = 0, copy = 0;
};

// Each transport against memcpy, raw TCP echo and (UCX) half of perftest's one-way rate over the same UCX_TLS:
// a push_pull moves each byte twice, so that half is the most it could move.
void print_ratios(const std::vector<std::unique_ptr<LocalPs>>& clusters, const std::vector<TransportRow>& rows) {
  std::printf("\nratios (medians): against memcpy, raw TCP echo, and the two-transfer ceiling (perftest one way / 2)\n");
  std::printf("| partition |");
  for (auto& c : clusters)
    std::printf(" %s/memcpy | %s/echo |%s", c->name.c_str(), c->name.c_str(),
                c->tls.empty() ? "" : (" " + c->name + "/ceiling |").c_str());
  std::printf("\n|---|");
  for (auto& c : clusters) std::printf(c->tls.empty() ? "---|---|" : "---|---|---|");
  std::printf("\n");
  for (const TransportRow& r : rows) {
    std::printf("| %s |", size_name(r.size).c_str());
    for (size_t i = 0; i < clusters.size(); ++i) {
      std::printf(" %.2f | %.2f |", r.ps[i] / r.copy, r.ps[i] / r.echo);
      if (clusters[i]->tls.empty()) continue;
      if (r.ceiling[i] > 0) std::printf(" %.2f |", r.ps[i] / (r.ceiling[i] / 2));
      else std::printf(" - |");
    }
    std::printf("\n");
  }
}

// Interleaved repetitions of one size, median of each: a shared machine gives no side a quiet spell of its own.
TransportRow measure_size(std::vector<std::unique_ptr<LocalPs>>& clusters, uint64_t s, uint64_t mib, int reps,
                          int raw_port, bool perftest, int& perftest_port) {
  std::vector<std::vector<double>> ps(clusters.size()), ceil(clusters.size());
  std::vector<double> echo, copy;
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < clusters.size(); ++i) {
      ps[i].push_back(ps_goodput(*clusters[i]->worker, s, mib));
      if (!perftest || clusters[i]->tls.empty()) continue;
      // A fresh port each time: the last run's may still be in TIME_WAIT.
      const std::optional<double> c = bench::ucx_perftest_rate(clusters[i]->tls, s, total_bytes(s, mib), perftest_port++);
      ceil[i].push_back(c.value_or(0));
    }
    echo.push_back(raw_echo("127.0.0.1", raw_port, s, total_bytes(s, mib), window_of(s) * s));
    copy.push_back(memcpy_rate(s, mib));
  }
  TransportRow row{s, {}, {}, median(echo), median(copy)};
  for (size_t i = 0; i < clusters.size(); ++i) {
    row.ps.push_back(median(ps[i]));
    row.ceiling.push_back(ceil[i].empty() ? 0 : median(ceil[i]));
  }
  return row;
}

}  // namespace

int compare_transports(const std::vector<uint64_t>& sizes, const std::string& transports, uint64_t mib, int reps,
                       const std::string& extra_tls) {
  const int base = 20000 + static_cast<int>(getpid() % 20000);
  std::thread raw([&] { raw_server(listen_on("127.0.0.1", base + 9)); });
  raw.detach();
  std::vector<std::unique_ptr<LocalPs>> clusters;
  if (wanted(transports, "zmq")) clusters.push_back(start_local_ps("zmq", "zmq", nullptr, base));
  if (ps::ucx_built_in()) {
    if (wanted(transports, "shm")) clusters.push_back(start_local_ps("ucx shm", "ucx", "sm,self", base + 1));
    if (wanted(transports, "tcp")) clusters.push_back(start_local_ps("ucx tcp", "ucx", "tcp", base + 2));
    if (!extra_tls.empty()) clusters.push_back(start_local_ps("ucx " + extra_tls, "ucx", extra_tls.c_str(), base + 3));
  } else {
    std::fprintf(stderr, "ps_goodput: this build has no UCX; only zmq is measured\n");
  }
  const bool perftest = bench::have_ucx_perftest();
  if (!perftest)
    std::printf("ucx_perftest is not on the PATH (Debian: ucx-utils): no perftest ceiling columns or ratios\n");
  std::printf("| partition |");
  for (auto& c : clusters) std::printf(" %s MB/s |", c->name.c_str());
  std::printf(" raw echo MB/s | memcpy MB/s |");
  size_t columns = clusters.size() + 2;
  for (auto& c : clusters)
    if (perftest && !c->tls.empty()) std::printf(" perftest %s one way MB/s |", c->tls.c_str()), ++columns;
  std::printf("\n|---|");
  for (size_t i = 0; i < columns; ++i) std::printf("---|");
  std::printf("\n");
  std::vector<TransportRow> rows;
  int perftest_port = base + 100;
  for (uint64_t s : sizes) {
    const TransportRow& r = rows.emplace_back(measure_size(clusters, s, mib, reps, base + 9, perftest, perftest_port));
    std::printf("| %s |", size_name(s).c_str());
    for (double v : r.ps) std::printf(" %.1f |", v / 1e6);
    std::printf(" %.1f | %.1f |", r.echo / 1e6, r.copy / 1e6);
    for (size_t i = 0; i < clusters.size(); ++i)
      if (perftest && !clusters[i]->tls.empty()) std::printf(" %.1f |", r.ceiling[i] / 1e6);
    std::printf("\n");
    std::fflush(stdout);
  }
  print_ratios(clusters, rows);
  for (auto& c : clusters) {
    c->worker->shutdown();
    c->server.join();
  }
  return 0;
}

int compare_fused(uint64_t parts, uint64_t mib, int reps) {
  const int base = 20000 + static_cast<int>(getpid() % 20000);
  std::vector<std::unique_ptr<LocalPs>> clusters;
  clusters.push_back(start_local_ps("zmq", "zmq", nullptr, base));
  if (ps::ucx_built_in()) {
    clusters.push_back(start_local_ps("ucx shm", "ucx", "sm,self", base + 1));
    clusters.push_back(start_local_ps("ucx tcp", "ucx", "tcp", base + 2));
  }
  std::printf("%llu partitions per round, one batch (fused) or a batch each (separate), MB/s\n| partition |",
              static_cast<unsigned long long>(parts));
  for (auto& c : clusters) std::printf(" %s fused | %s separate | fused/separate |", c->name.c_str(), c->name.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < clusters.size(); ++i) std::printf("---|---|---|");
  std::printf("\n");
  for (uint64_t s : {4ull << 10, 16ull << 10, 64ull << 10, 256ull << 10}) {
    std::printf("| %s |", size_name(s).c_str());
    for (auto& c : clusters) {
      std::vector<double> f, sep;  // interleaved repetitions, median of each
      for (int r = 0; r < reps; ++r) {
        f.push_back(ps_round_goodput(*c->worker, s, parts, true, mib));
        sep.push_back(ps_round_goodput(*c->worker, s, parts, false, mib));
      }
      std::printf(" %.1f | %.1f | %.2f |", median(f) / 1e6, median(sep) / 1e6, median(f) / median(sep));
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  for (auto& c : clusters) {
    c->worker->shutdown();
    c->server.join();
  }
  return 0;
}

}  // namespace commsched::bench
