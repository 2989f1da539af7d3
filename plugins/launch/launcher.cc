#include "plugins/launch/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>

#include "comm_backends/ps/transport.h"
#include "scheduler/types.h"

namespace commsched {
namespace {

struct Child {
  std::string name;
  pid_t pid = -1;
  bool worker = false;
  std::optional<int> code;
};

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("commsched launch: cannot find a free loopback port");
  ::close(fd);
  return ntohs(a.sin_port);
}

void say(const std::string& line) { std::fprintf(stderr, "[commsched launch] %s\n", line.c_str()); }

// Every process is on this host: UCX shared memory when UCX is built in, unless the caller chose a transport
// (COMMSCHED_PS_TRANSPORT) or UCX's transports (UCX_TLS) already. ZeroMQ otherwise.
std::map<std::string, std::string> transport_env() {
  if (!ps::ucx_built_in() || std::getenv("COMMSCHED_PS_TRANSPORT")) return {};
  std::map<std::string, std::string> env = {{"COMMSCHED_PS_TRANSPORT", "ucx"}};
  if (!std::getenv("UCX_TLS")) env["UCX_TLS"] = "sm,self";
  return env;
}

std::string transport_note() {
  const char* t = std::getenv("COMMSCHED_PS_TRANSPORT");
  const auto env = transport_env();
  const std::string kind = t ? t : (env.empty() ? "zmq" : "ucx");
  const char* tls = std::getenv("UCX_TLS");
  if (kind != "ucx") return "PS transport " + kind;
  return "PS transport ucx (UCX_TLS=" + (tls ? std::string(tls) : env.count("UCX_TLS") ? env.at("UCX_TLS") : "") + ")";
}

class Cluster {
 public:
  explicit Cluster(const LaunchOptions& o) : o_(o) {}

  int run() {
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGINT, SIGTERM, SIGCHLD}) sigaddset(&mask, s);
    sigprocmask(SIG_BLOCK, &mask, &old_mask_);  // handled synchronously with sigtimedwait below
    port_ = free_loopback_port();
    for (int s = 0; s < o_.servers; ++s) spawn("server", s);
    for (int w = 0; w < o_.workers; ++w) spawn("worker", w);
    say("started " + std::to_string(o_.servers) + " server(s) and " + std::to_string(o_.workers) +
        " worker(s) on 127.0.0.1:" + std::to_string(port_) + "; " + transport_note());
    const int rc = supervise(mask);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    return rc;
  }

 private:
  void spawn(const std::string& role, int rank) {
    const bool worker = role == "worker";
    std::vector<std::string> argv = worker ? o_.command : o_.server_args;
    const std::string exe = worker ? o_.command.front() : (o_.server_exe.empty() ? "/proc/self/exe" : o_.server_exe);
    if (!worker) argv.insert(argv.begin(), exe);
    std::map<std::string, std::string> env = {
        {"COMMSCHED_ROLE", role}, {"COMMSCHED_RANK", std::to_string(rank)},
        {"COMMSCHED_NUM_WORKERS", std::to_string(o_.workers)}, {"COMMSCHED_NUM_SERVERS", std::to_string(o_.servers)},
        {"COMMSCHED_ROOT_ADDR", "127.0.0.1"}, {"COMMSCHED_ROOT_PORT", std::to_string(port_)},
        {"COMMSCHED_BIND", "127.0.0.1"}, {"COMMSCHED_LOCAL_RANK", std::to_string(worker ? rank : 0)},
        {"COMMSCHED_LOCAL_SIZE", std::to_string(worker ? o_.workers : 1)}};
    env.merge(transport_env());
    if (!o_.emulate_rate.empty()) env["COMMSCHED_EMULATE_RATE"] = o_.emulate_rate;
    if (o_.deterministic) env["COMMSCHED_PS_DETERMINISTIC"] = "1";
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("commsched launch: fork failed: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      setpgid(0, pgid_);
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(exe.c_str(), args.data());
      std::fprintf(stderr, "[commsched launch] cannot run '%s': %s\n", exe.c_str(), std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pgid_);  // from both sides: no window in which the child is outside the group
    if (pgid_ == 0) pgid_ = pid;
    children_.push_back(Child{role + " " + std::to_string(rank), pid, worker, {}});
  }

  // Reaps exited children; returns the first non-zero exit seen (if any).
  std::optional<std::pair<std::string, int>> reap() {
    std::optional<std::pair<std::string, int>> bad;
    for (auto& c : children_) {
      if (c.code) continue;
      int st = 0;
      if (waitpid(c.pid, &st, WNOHANG) != c.pid) continue;
      c.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (*c.code != 0 && !bad) bad = std::make_pair(c.name, *c.code);
    }
    return bad;
  }

  bool all_exited(bool workers_only) const {
    for (auto& c : children_)
      if (!c.code && (c.worker || !workers_only)) return false;
    return true;
  }

  int supervise(const sigset_t& mask) {
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> servers_deadline;
    for (;;) {
      timespec tick{0, 100'000'000};
      const int sig = sigtimedwait(&mask, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        say(std::string(sig == SIGINT ? "interrupted" : "terminated") + "; stopping the cluster");
        teardown(sig);
        return 130;
      }
      if (auto bad = reap()) {
        say(bad->first + " exited with status " + std::to_string(bad->second) + "; tearing down the cluster");
        teardown(SIGTERM);
        return bad->second;
      }
      if (all_exited(false)) return 0;
      // Workers done: servers leave on their own once every worker said goodbye; do not wait forever.
      if (all_exited(true)) {
        if (!servers_deadline)
          servers_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
        if (Clock::now() > *servers_deadline) {
          say("servers did not exit after the workers finished; stopping them");
          teardown(SIGTERM);
          return 1;
        }
      }
    }
  }

  void teardown(int sig) {
    if (pgid_ > 0) ::kill(-pgid_, sig);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(o_.grace_s));
    while (!all_exited(false) && std::chrono::steady_clock::now() < deadline) {
      reap();
      usleep(20'000);
    }
    if (!all_exited(false)) {
      ::kill(-pgid_, SIGKILL);
      for (auto& c : children_)
        if (!c.code) waitpid(c.pid, nullptr, 0), c.code = 137;
    }
  }

  LaunchOptions o_;
  sigset_t old_mask_{};
  int port_ = 0;
  pid_t pgid_ = 0;
  std::vector<Child> children_;
};

}  // namespace

int launch_local_cluster(const LaunchOptions& opts) {
  if (opts.workers < 1) throw InvalidArgument("launch: --workers must be at least 1, got " + std::to_string(opts.workers));
  if (opts.servers < 0) throw InvalidArgument("launch: --servers must be at least 0, got " + std::to_string(opts.servers));
  if (opts.command.empty()) throw InvalidArgument("launch: no worker command given (use: launch -w 4 -s 2 -- cmd ...)");
  return Cluster(opts).run();
}

}  // namespace commsched
