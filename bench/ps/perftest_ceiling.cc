#include "bench/ps/perftest_ceiling.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

extern char** environ;

namespace commsched::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kPerftest = "ucx_perftest";
constexpr auto kLimit = std::chrono::seconds(120);  // one measurement, server and client together
constexpr int kWarmup = 20;

// A perftest process, its stdout and stderr through one pipe.
struct Child {
  pid_t pid = -1;
  int out = -1;
};

// This process's environment with UCX_TLS replaced by `tls` (perftest reads it itself).
std::vector<std::string> env_with_tls(const std::string& tls) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "UCX_TLS=", 8) != 0) env.emplace_back(*e);
  env.push_back("UCX_TLS=" + tls);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

Child spawn(std::vector<std::string> argv, const std::string& tls) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<std::string> env = env_with_tls(tls);
  Child c;
  if (posix_spawnp(&c.pid, kPerftest, &fa, nullptr, c_strings(argv).data(), c_strings(env).data()) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (c.pid < 0) ::close(fds[0]);
  else c.out = fds[0];
  return c;
}

// Everything the child prints until it exits; killed (and said so) at `deadline`.
std::string finish(Child& c, Clock::time_point deadline) {
  std::string text;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{c.out, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) {
      ::kill(c.pid, SIGKILL);
      text += "\n(killed: no result within " + std::to_string(kLimit.count()) + " s)";
      break;
    }
    const ssize_t n = ::read(c.out, buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(c.out);
  ::waitpid(c.pid, nullptr, 0);
  return text;
}

// The server prints nothing until it exits (its stdout is a pipe), so the client is started until it stops being
// refused: the server listens a few milliseconds after it starts.
std::string run_client(const std::vector<std::string>& argv, const std::string& tls, Clock::time_point deadline) {
  for (;;) {
    Child c = spawn(argv, tls);
    if (c.pid < 0) return "could not start " + std::string(kPerftest);
    std::string out = finish(c, deadline);
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
  Child server = spawn({kPerftest, "-p", p}, tls);
  if (server.pid < 0) {
    std::fprintf(stderr, "ucx_perftest: could not start its server\n");
    return std::nullopt;
  }
  const std::string client = run_client({kPerftest, "127.0.0.1", "-p", p, "-t", "tag_bw", "-s", std::to_string(bytes),
                                         "-n", std::to_string(iters), "-w", std::to_string(kWarmup)},
                                        tls, deadline);
  const std::optional<double> rate = parse_perftest_final(client);
  if (!rate) ::kill(server.pid, SIGKILL);  // else it exits once its client has finished
  const std::string served = finish(server, deadline);
  if (!rate)
    std::fprintf(stderr, "ucx_perftest (UCX_TLS=%s, %llu bytes, port %d) gave no result: %s | server: %s\n", tls.c_str(),
                 static_cast<unsigned long long>(bytes), port, last_line(client).c_str(), last_line(served).c_str());
  return rate;
}

}  // namespace commsched::bench
