#include "bench/ps/perftest_ceiling.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "plugins/launch/process_group.h"

namespace commsched::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kPerftest = "ucx_perftest";
constexpr auto kLimit = std::chrono::seconds(120);  // one measurement, server and client together
constexpr int kWarmup = 20;

// Ctrl-C reaches the terminal's foreground process group only, and the perftest processes run in groups of their own
// (ProcessGroup): without this an interrupted ps_goodput would leave its perftest server listening. While a measurement
// runs, SIGINT and SIGTERM first SIGKILL the perftest processes under way, then take their former course (the old
// disposition restored, the signal raised again). Each perftest leads its group: its pid is the group's id.
std::atomic<pid_t> g_perftest[2];  // the server and the current client under way; 0: none
struct sigaction g_previous[2];    // SIGINT's and SIGTERM's dispositions before the measurement
constexpr int kStopSignals[2] = {SIGINT, SIGTERM};

void kill_perftest_and_reraise(int sig) {
  for (auto& running : g_perftest)
    if (const pid_t pid = running.load(); pid > 0) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);  // also if it has left its group
    }
  ::sigaction(sig, &g_previous[sig == SIGINT ? 0 : 1], nullptr);
  ::raise(sig);  // blocked until this handler returns, then the former disposition acts on it
}

// The handlers, for the life of one measurement (ps_goodput measures one at a time).
class KillPerftestOnInterrupt {
 public:
  KillPerftestOnInterrupt() {
    struct sigaction kill_first {};
    kill_first.sa_handler = kill_perftest_and_reraise;
    sigemptyset(&kill_first.sa_mask);
    for (int i = 0; i < 2; ++i) ::sigaction(kStopSignals[i], &kill_first, &g_previous[i]);
  }
  ~KillPerftestOnInterrupt() {
    for (int i = 0; i < 2; ++i) ::sigaction(kStopSignals[i], &g_previous[i], nullptr);
    for (auto& running : g_perftest) running = 0;
  }
  KillPerftestOnInterrupt(const KillPerftestOnInterrupt&) = delete;
  KillPerftestOnInterrupt& operator=(const KillPerftestOnInterrupt&) = delete;
};

// A directory for the two perftest logs, removed with them when the measurement ends.
class LogDir {
 public:
  LogDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/perftest_XXXXXX";
    if (::mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~LogDir() {
    if (path_.empty()) return;
    for (const char* f : {"/server.log", "/client.log"}) ::unlink((path_ + f).c_str());
    ::rmdir(path_.c_str());
  }
  bool ok() const { return !path_.empty(); }
  std::string file(const char* name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// perftest reads UCX_TLS itself; its stdout and stderr go to `log`.
ProcessSpec perftest(const std::string& name, std::vector<std::string> args, const std::string& tls,
                     const std::string& log) {
  args.insert(args.begin(), kPerftest);
  return ProcessSpec{name, std::move(args), {{"UCX_TLS", tls}}, log};
}

// Everything the group's one process printed once it exited; killed (and said so) at `deadline`.
std::string finish(ProcessGroup& group, const std::string& log, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  std::string note;
  if (!group.wait_all(std::max(left, std::chrono::milliseconds(0)))) {
    group.kill_all();
    note = "\n(killed: no result within " + std::to_string(kLimit.count()) + " s)";
  }
  return slurp(log) + note;
}

// The server prints nothing until it exits (its stdout is a file), so the client is started until it stops being
// refused: the server listens a few milliseconds after it starts.
std::string run_client(const std::vector<std::string>& args, const std::string& tls, const std::string& log,
                       Clock::time_point deadline) {
  ProcessGroup clients(std::nullopt, kPerftest);
  for (;;) {
    g_perftest[1] = clients.member(clients.spawn(perftest("perftest client", args, tls, log))).pid;
    std::string out = finish(clients, log, deadline);
    g_perftest[1] = 0;
    if (out.find("Connection refused") == std::string::npos || Clock::now() + std::chrono::seconds(1) > deadline)
      return out;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The last line of perftest's output that is not empty (its error, when it failed).
std::string last_line(const std::string& out) {
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t") != std::string::npos) last = line;
  return last;
}

}  // namespace

bool have_ucx_perftest() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((d + "/" + kPerftest).c_str(), X_OK) == 0) return true;
  return false;
}

std::optional<double> parse_perftest_final(const std::string& output) {
  const size_t at = output.rfind("Final:");
  if (at == std::string::npos) return std::nullopt;
  std::istringstream row(output.substr(at + 6, output.find('\n', at) - at - 6));
  double v[6];  // iterations, three latencies, the average and the overall bandwidth
  for (double& x : v)
    if (!(row >> x)) return std::nullopt;
  return v[5] * 1024 * 1024;  // MiB/s
}

std::optional<double> ucx_perftest_rate(const std::string& tls, uint64_t bytes, uint64_t total, int port) {
  const auto deadline = Clock::now() + kLimit;
  const std::string p = std::to_string(port);
  const uint64_t iters = std::max<uint64_t>(100, total / bytes);
  const LogDir logs;
  if (!logs.ok()) {
    std::fprintf(stderr, "ucx_perftest: no temporary directory for its output\n");
    return std::nullopt;
  }
  const KillPerftestOnInterrupt interrupted;
  ProcessGroup server(std::nullopt, kPerftest);
  g_perftest[0] = server.member(server.spawn(perftest("perftest server", {"-p", p}, tls, logs.file("server.log")))).pid;
  const std::string client = run_client({"127.0.0.1", "-p", p, "-t", "tag_bw", "-s", std::to_string(bytes), "-n",
                                         std::to_string(iters), "-w", std::to_string(kWarmup)},
                                        tls, logs.file("client.log"), deadline);
  const std::optional<double> rate = parse_perftest_final(client);
  if (!rate) server.kill_all();  // else it exits once its client has finished
  const std::string served = finish(server, logs.file("server.log"), deadline);
  g_perftest[0] = 0;
  if (!rate)
    std::fprintf(stderr, "ucx_perftest (UCX_TLS=%s, %llu bytes, port %d) gave no result: %s | server: %s\n", tls.c_str(),
                 static_cast<unsigned long long>(bytes), port, last_line(client).c_str(), last_line(served).c_str());
  return rate;
}

}  // namespace commsched::bench
