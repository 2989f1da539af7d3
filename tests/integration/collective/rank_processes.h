// Starts N rank processes on loopback with the ClusterEnv contract (COMMSCHED_NUM_WORKERS, COMMSCHED_RANK,
// COMMSCHED_ROOT_ADDR/PORT on a free port) and always reaps them: whatever is still running when the group goes out of
// scope is SIGKILLed.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace commsched::testing {

// A port nobody listens on right now (the kernel's choice for an ephemeral bind).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("free_port: cannot bind an ephemeral port");
  ::close(fd);
  return ntohs(a.sin_port);
}

struct RankExit {
  int rank = -1;
  bool exited = false;     // normal exit (see code) as opposed to a signal
  int code = -1;           // exit code, or the signal number
  std::chrono::steady_clock::time_point when;
};

class RankProcesses {
 public:
  // Starts `n` copies of `binary args...`, rank i with COMMSCHED_RANK=i, plus `env` for all.
  RankProcesses(const std::string& binary, const std::vector<std::string>& args, int n,
                const std::map<std::string, std::string>& env = {}) {
    const std::string port = std::to_string(free_port());
    for (int rank = 0; rank < n; ++rank) {
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) exec_rank(binary, args, n, rank, port, env);
      pids_.push_back(pid);
    }
  }
  ~RankProcesses() { kill_all(); }
  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  // Waits until every rank has exited or `limit` passes (then kills the rest). Returns one entry per rank.
  std::vector<RankExit> wait(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<RankExit> exits(pids_.size());
    size_t left = pids_.size();
    while (left > 0 && std::chrono::steady_clock::now() < deadline) {
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0) continue;
        int status = 0;
        if (::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
        exits[i] = {static_cast<int>(i), WIFEXITED(status), WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                    std::chrono::steady_clock::now()};
        pids_[i] = 0;
        --left;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    kill_all();
    return exits;
  }

 private:
  [[noreturn]] static void exec_rank(const std::string& binary, const std::vector<std::string>& args, int n, int rank,
                                     const std::string& port, const std::map<std::string, std::string>& env) {
    ::setenv("COMMSCHED_NUM_WORKERS", std::to_string(n).c_str(), 1);
    ::setenv("COMMSCHED_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("COMMSCHED_ROOT_ADDR", "127.0.0.1", 1);
    ::setenv("COMMSCHED_ROOT_PORT", port.c_str(), 1);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }

  void kill_all() {
    for (pid_t& pid : pids_)
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = 0;
      }
  }

  std::vector<pid_t> pids_;
};

}  // namespace commsched::testing
