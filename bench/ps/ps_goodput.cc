// Parameter-server goodput against raw TCP, partition sizes 64 KiB .. 64 MiB, one run, side by side.
//
//   ps_goodput local [--mib-per-size N] [--reps R]  server thread + worker + raw TCP, all on loopback (median of R)
//   ps_goodput transports [--mib-per-size N] [--reps R] [--transports zmq,shm,tcp]
//                                                   the same for zmq, UCX shared memory (UCX_TLS=sm,self) and UCX TCP
//                                                   (UCX_TLS=tcp) side by side, beside raw TCP echo, a memcpy loop and
//                                                   ucx_perftest tag_bw over each UCX column's UCX_TLS (left out, said
//                                                   so, when it is not installed), then each one's ratios to those;
//                                                   --ucx-tls LIST adds a column for UCX over LIST (e.g. rc,ud:aux)
//   ps_goodput fused [--parts N] [--mib-per-size M] [--reps R]      (M: 32; the other modes 256, workers 64)
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
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench/ps/goodput_core.h"
#include "bench/ps/goodput_modes.h"
#include "bench/ps/raw_tcp.h"
#include "comm_backends/ps/server.h"

using namespace commsched;
using namespace commsched::bench;

namespace {

void print_header(bool with_ps) {
  std::printf("| partition | %sraw echo MB/s | raw one-way MB/s |%s\n", with_ps ? "PS push_pull MB/s | " : "",
              with_ps ? " PS / raw echo |" : "");
  std::printf("|---|%s---|---|%s\n", with_ps ? "---|" : "", with_ps ? "---|" : "");
}

// PS push_pull against raw TCP echo and one-way on loopback, a server thread and a raw server beside the worker.
int run_local(const std::vector<uint64_t>& sizes, uint64_t mib, int reps) {
  const int ps_port = 20000 + static_cast<int>(getpid() % 20000), raw_port = ps_port + 1;
  std::thread server([&] { run_server(env_for(Role::server, "127.0.0.1", ps_port), PsConfig::from_env()); });
  std::thread raw([&] { raw_server(listen_on("127.0.0.1", raw_port)); });
  raw.detach();
  PsBackend b(env_for(Role::worker, "127.0.0.1", ps_port), PsConfig::from_env());
  print_header(true);
  for (uint64_t s : sizes) {
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ps_goodput local|ps-server|ps-worker|raw-server|raw-client [--root A] [--bind A] "
                         "[--port P] [--mib-per-size N]\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::map<std::string, std::string> opt = {{"--root", "127.0.0.1"}, {"--bind", "127.0.0.1"}, {"--port", "0"}};
  for (int i = 2; i + 1 < argc; i += 2) opt[argv[i]] = argv[i + 1];
  const int port = std::stoi(opt["--port"]);
  std::vector<uint64_t> sizes = default_sizes();
  if (opt.count("--only")) {  // bytes, comma-separated: these partition sizes only
    sizes.clear();
    for (size_t at = 0; at <= opt["--only"].size();) {
      const size_t end = std::min(opt["--only"].find(',', at), opt["--only"].size());
      sizes.push_back(std::stoull(opt["--only"].substr(at, end - at)));
      at = end + 1;
    }
  }
  // MiB moved per partition size; each mode has its default (the fused and workers modes move less per round).
  const auto mib_or = [&](uint64_t fallback) {
    return opt.count("--mib-per-size") ? std::stoull(opt["--mib-per-size"]) : fallback;
  };
  const uint64_t mib = mib_or(256);
  const int reps = opt.count("--reps") ? std::stoi(opt["--reps"]) : 3;
  // --transports zmq,shm,tcp (default: all three): which clusters the transports and workers modes measure.
  const std::string transports = opt.count("--transports") ? opt["--transports"] : "zmq,shm,tcp";
  try {
    if (mode == "ps-server") return run_server(env_for(Role::server, opt["--bind"], port), PsConfig::from_env(), true);
    if (mode == "raw-server") {
      raw_server(listen_on(opt["--bind"], port));
      return 0;
    }
    if (mode == "ps-worker") {
      PsBackend b(env_for(Role::worker, opt["--root"], port), PsConfig::from_env());
      std::printf("| partition | PS push_pull MB/s |\n|---|---|\n");
      for (uint64_t s : sizes) std::printf("| %s | %.1f |\n", size_name(s).c_str(), ps_goodput(b, s, mib) / 1e6);
      b.shutdown();
      return 0;
    }
    if (mode == "raw-client") {
      print_header(false);
      for (uint64_t s : sizes)
        std::printf("| %s | %.1f | %.1f |\n", size_name(s).c_str(),
                    raw_echo(opt["--root"], port, s, total_bytes(s, mib), window_of(s) * s) / 1e6,
                    raw_oneway(opt["--root"], port, s, total_bytes(s, mib)) / 1e6);
      return 0;
    }
    if (mode == "fused")
      return compare_fused(opt.count("--parts") ? std::stoull(opt["--parts"]) : 64,
                           mib_or(32), reps);
    if (mode == "workers")
      return compare_workers(sizes, transports, opt.count("--workers") ? std::stoi(opt["--workers"]) : 4,
                             mib_or(64), reps);
    if (mode == "transports")
      return compare_transports(sizes, transports, mib, reps, opt.count("--ucx-tls") ? opt["--ucx-tls"] : "");
    if (mode == "local") return run_local(sizes, mib, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_goodput: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
