// Parameter-server goodput against raw TCP, partition sizes 64 KiB .. 64 MiB, one run, side by side.
//
//   ps_goodput local [--mib-per-size N] [--reps R]  server thread + worker + raw TCP, all on loopback (median of R)
//   ps_goodput transports [--mib-per-size N] [--reps R] [--transports zmq,shm,tcp]
//                                                   the same for zmq, UCX shared memory (UCX_TLS=sm,self) and UCX TCP
//                                                   (UCX_TLS=tcp) side by side, beside raw TCP echo, a memcpy loop and
//                                                   ucx_perftest tag_bw over each UCX column's UCX_TLS (left out, said
//                                                   so, when it is not installed), then each one's ratios to those;
//                                                   --ucx-tls LIST adds a column for UCX over LIST (e.g. rc,ud:aux)
//   ps_goodput fused [--parts N] [--mib-per-size M] [--reps R]
//                                                   N small partitions (4..256 KiB, each its own tensor) per round as
//                                                   one fused batch (one message each way) against N batches of one
//                                                   (a message each way apiece), every transport, rounds back to back
//   ps_goodput workers [--workers W] [--mib-per-size M] [--reps R] [--transports zmq,shm,tcp]
//                                                   W workers (each its own PsBackend, in this process) and one
//                                                   server, zmq, UCX shared memory and UCX TCP: each worker push_pulls rounds
//                                                   of partitions, one message each; the workers' goodputs summed
//   ps_goodput ps-server --bind ADDR --port P        one PS server (1 worker) on ADDR:P      (for netns_bench.sh)
//   ps_goodput ps-worker --root ADDR --port P        PS goodput against that server
//   ps_goodput raw-server --bind ADDR --port P       raw TCP echo/discard server
//   ps_goodput raw-client --root ADDR --port P       raw TCP goodput against it
//
// Every mode takes --only BYTES[,BYTES...]: those partition sizes instead of 64 KiB .. 64 MiB.
//
// PS goodput = partition bytes push_pulled per second (each partition goes to the server and its sum comes back),
// with a window of partitions in flight. Raw echo = the same traffic on a bare TCP socket (send, peer echoes back,
// same window): the fair baseline for push_pull. Raw one-way = a plain stream (what iperf3 measures).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/ps/perftest_ceiling.h"
#include "bench/ps/raw_tcp.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/ps/ps_backend.h"
#include "comm_backends/ps/server.h"
#include "comm_backends/ps/transport.h"
#include "scheduler/completion_waiter.h"

using namespace commsched;
using bench::listen_on;
using bench::raw_echo;
using bench::raw_oneway;
using bench::raw_server;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<uint64_t> kSizes = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
uint64_t total_bytes(uint64_t part, uint64_t mib) { return std::max<uint64_t>(mib << 20, 8 * part); }
uint64_t window_of(uint64_t part) { return std::max<uint64_t>(4, (32ull << 20) / part); }  // >= 32 MiB in flight

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ---------------- parameter server ----------------
// `n` f32 tensors of `part` bytes each, over zeroed buffers kept in `bufs`.
std::vector<TaskDesc> make_tasks(const std::string& prefix, uint64_t part, uint64_t n,
                                 std::vector<std::vector<std::byte>>& bufs) {
  std::vector<TaskDesc> tasks(n);
  bufs.assign(n, std::vector<std::byte>(part, std::byte{0}));
  for (uint64_t s = 0; s < n; ++s) {
    tasks[s].name = prefix + std::to_string(part) + "." + std::to_string(s);
    tasks[s].key = task_key(tasks[s].name);
    tasks[s].dtype = DType::f32;
    tasks[s].count = part / 4;
    tasks[s].buffer.data = bufs[s].data();
  }
  return tasks;
}

double ps_goodput(PsBackend& b, uint64_t part, uint64_t mib) {
  const uint64_t window = window_of(part), total = total_bytes(part, mib);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<TaskDesc> tasks = make_tasks("bench.", part, window, bufs);
  // A completion frees its slot for the next partition: the waiter counts partitions in flight, the deque says
  // which slots are free (filled before the completion settles, so a wake-up always finds one).
  CompletionWaiter waiter;
  std::mutex free_mu;
  std::deque<uint64_t> free_slots;
  auto submit = [&](uint64_t s) {
    waiter.expect(1);
    b.start({PartitionView{&tasks[s], 0, 0, part}}, [&, s](const Status& st) {
      {
        std::lock_guard lock(free_mu);
        free_slots.push_back(s);
      }
      waiter.settle(st);
    });
  };
  const auto t0 = Clock::now();
  uint64_t sent = 0, done = 0;
  for (uint64_t s = 0; s < window && sent < total; ++s, sent += part) submit(s);
  while (done < sent) {
    const uint64_t in_flight = (sent - done) / part;
    if (const Status st = waiter.wait(std::chrono::seconds(60), in_flight - 1); !st.ok()) {
      std::fprintf(stderr, "push_pull of %llu-byte partitions failed: %s\n", static_cast<unsigned long long>(part),
                   st.message.c_str());
      waiter.wait(std::chrono::seconds(60));  // the rest still write into these buffers
      return 0;
    }
    uint64_t s;
    {
      std::lock_guard lock(free_mu);
      s = free_slots.front();
      free_slots.pop_front();
    }
    done += part;
    if (sent < total) {
      ++tasks[s].round;
      submit(s);
      sent += part;
    }
  }
  return static_cast<double>(total) / seconds_since(t0);
}

// Rounds of `parts` partitions of `part` bytes, each round submitted at once and waited for (a training step's small
// tensors): as one batch (`fused`) or as one batch per partition. Partitions push_pulled per second, in bytes.
double ps_round_goodput(PsBackend& b, uint64_t part, uint64_t parts, bool fused, uint64_t mib) {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<TaskDesc> tasks = make_tasks("fused.", part, parts, bufs);
  const uint64_t rounds = std::max<uint64_t>(4, (mib << 20) / (part * parts));
  const auto t0 = Clock::now();
  for (uint64_t r = 0; r < rounds; ++r) {
    CompletionWaiter waiter;
    std::vector<PartitionView> all;
    for (auto& t : tasks) {
      t.round = r;
      all.push_back(PartitionView{&t, 0, 0, part});
    }
    if (fused) {
      b.start(std::move(all), waiter.callback());
    } else {
      for (const PartitionView& v : all) b.start({v}, waiter.callback());
    }
    if (const Status st = waiter.wait(std::chrono::seconds(60)); !st.ok()) {
      std::fprintf(stderr, "a round of %llu-byte partitions failed: %s\n", static_cast<unsigned long long>(part),
                   st.message.c_str());
      return 0;
    }
  }
  return static_cast<double>(rounds * parts * part) / seconds_since(t0);
}

ClusterEnv env_for(Role role, const std::string& addr, int port, int workers = 1, int rank = 0) {
  ClusterEnv e;
  e.role = role;
  e.rank = rank;
  e.num_workers = workers;
  e.num_servers = 1;
  e.root_addr = addr;
  e.root_port = port;
  e.bind = addr;
  return e;
}

double median(std::vector<double> v);
std::string size_name(uint64_t b);

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

// --transports zmq,shm,tcp (default: all three): which clusters the transports and workers modes measure.
std::string g_transports = "zmq,shm,tcp";
bool wanted(const std::string& t) { return ("," + g_transports + ",").find("," + t + ",") != std::string::npos; }

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

int compare_transports(uint64_t mib, int reps, const std::string& extra_tls) {
  const int base = 20000 + static_cast<int>(getpid() % 20000);
  std::thread raw([&] { raw_server(listen_on("127.0.0.1", base + 9)); });
  raw.detach();
  std::vector<std::unique_ptr<LocalPs>> clusters;
  if (wanted("zmq")) clusters.push_back(start_local_ps("zmq", "zmq", nullptr, base));
  if (ps::ucx_built_in()) {
    if (wanted("shm")) clusters.push_back(start_local_ps("ucx shm", "ucx", "sm,self", base + 1));
    if (wanted("tcp")) clusters.push_back(start_local_ps("ucx tcp", "ucx", "tcp", base + 2));
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
  for (uint64_t s : kSizes) {
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


int compare_workers(int workers, uint64_t mib, int reps) {
  const int base = 20000 + static_cast<int>(getpid() % 20000);
  std::vector<std::unique_ptr<MultiPs>> clusters;
  if (wanted("zmq")) clusters.push_back(start_multi_ps("zmq", "zmq", nullptr, base, workers));
  if (ps::ucx_built_in()) {
    if (wanted("shm")) clusters.push_back(start_multi_ps("ucx shm", "ucx", "sm,self", base + 1, workers));
    if (wanted("tcp")) clusters.push_back(start_multi_ps("ucx tcp", "ucx", "tcp", base + 2, workers));
  }
  std::printf("%d worker(s), 1 server: the workers' push_pull goodputs summed\n| partition |", workers);
  for (auto& c : clusters) std::printf(" %s MB/s |", c->name.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < clusters.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (uint64_t s : kSizes) {
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string size_name(uint64_t b) {
  return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
}

void print_header(bool with_ps) {
  std::printf("| partition | %sraw echo MB/s | raw one-way MB/s |%s\n", with_ps ? "PS push_pull MB/s | " : "",
              with_ps ? " PS / raw echo |" : "");
  std::printf("|---|%s---|---|%s\n", with_ps ? "---|" : "", with_ps ? "---|" : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ps_goodput local|ps-server|ps-worker|raw-server|raw-client [--root A] [--bind A] "
                         "[--port P] [--mib-per-size N]\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::map<std::string, std::string> opt = {{"--root", "127.0.0.1"}, {"--bind", "127.0.0.1"}, {"--port", "0"},
                                            {"--mib-per-size", "256"}};
  for (int i = 2; i + 1 < argc; i += 2) opt[argv[i]] = argv[i + 1];
  const int port = std::stoi(opt["--port"]);
  if (opt.count("--only")) {  // bytes, comma-separated: these partition sizes only
    kSizes.clear();
    for (size_t at = 0; at <= opt["--only"].size();) {
      const size_t end = std::min(opt["--only"].find(',', at), opt["--only"].size());
      kSizes.push_back(std::stoull(opt["--only"].substr(at, end - at)));
      at = end + 1;
    }
  }
  const uint64_t mib = std::stoull(opt["--mib-per-size"]);
  const int reps = opt.count("--reps") ? std::stoi(opt["--reps"]) : 3;
  if (opt.count("--transports")) g_transports = opt["--transports"];
  try {
    if (mode == "ps-server") return run_server(env_for(Role::server, opt["--bind"], port), PsConfig::from_env(), true);
    if (mode == "raw-server") {
      raw_server(listen_on(opt["--bind"], port));
      return 0;
    }
    if (mode == "ps-worker") {
      PsBackend b(env_for(Role::worker, opt["--root"], port), PsConfig::from_env());
      std::printf("| partition | PS push_pull MB/s |\n|---|---|\n");
      for (uint64_t s : kSizes) std::printf("| %s | %.1f |\n", size_name(s).c_str(), ps_goodput(b, s, mib) / 1e6);
      b.shutdown();
      return 0;
    }
    if (mode == "raw-client") {
      print_header(false);
      for (uint64_t s : kSizes)
        std::printf("| %s | %.1f | %.1f |\n", size_name(s).c_str(), raw_echo(opt["--root"], port, s, total_bytes(s, mib), window_of(s) * s) / 1e6,
                    raw_oneway(opt["--root"], port, s, total_bytes(s, mib)) / 1e6);
      return 0;
    }
    if (mode == "fused")
      return compare_fused(opt.count("--parts") ? std::stoull(opt["--parts"]) : 64, opt.count("--mib-per-size") ? mib : 32,
                           reps);
    if (mode == "workers")
      return compare_workers(opt.count("--workers") ? std::stoi(opt["--workers"]) : 4, opt.count("--mib-per-size") ? mib : 64,
                             reps);
    if (mode == "transports") return compare_transports(mib, reps, opt.count("--ucx-tls") ? opt["--ucx-tls"] : "");
    if (mode == "local") {
      const int ps_port = 20000 + static_cast<int>(getpid() % 20000), raw_port = ps_port + 1;
      std::thread server([&] { run_server(env_for(Role::server, "127.0.0.1", ps_port), PsConfig::from_env()); });
      std::thread raw([&] { raw_server(listen_on("127.0.0.1", raw_port)); });
      raw.detach();
      PsBackend b(env_for(Role::worker, "127.0.0.1", ps_port), PsConfig::from_env());
      print_header(true);
      for (uint64_t s : kSizes) {
        // Interleaved repetitions, median of each: the machine may be shared, so neither side gets a quiet spell.
        std::vector<double> p, e, o;
        for (int r = 0; r < reps; ++r) {
          p.push_back(ps_goodput(b, s, mib));
          e.push_back(raw_echo("127.0.0.1", raw_port, s, total_bytes(s, mib), window_of(s) * s));
          o.push_back(raw_oneway("127.0.0.1", raw_port, s, total_bytes(s, mib)));
        }
        const double ps = median(p), echo = median(e), one = median(o);
        std::printf("| %s | %.1f | %.1f | %.1f | %.2f |\n", size_name(s).c_str(), ps / 1e6, echo / 1e6, one / 1e6,
                    ps / echo);
        std::fflush(stdout);
      }
      b.shutdown();
      server.join();
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_goodput: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
