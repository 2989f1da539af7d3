#include "plugins/launch/process_group.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace commsched {

ProcessGroup::ProcessGroup(std::optional<sigset_t> child_mask, std::string tag)
    : child_mask_(child_mask), tag_(std::move(tag)) {}

ProcessGroup::~ProcessGroup() { kill_all(); }

size_t ProcessGroup::spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) throw std::runtime_error(tag_ + ": no program given for " + spec.name);
  // A group lives while one of its members does (a zombie not yet reaped included). Once every member has been
  // reaped (an elastic run starting a worker again after all others exited), the next child leads a new group: the
  // old id may belong to another process by now.
  if (alive() == 0) pgid_ = 0;
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(tag_ + ": fork failed: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, pgid_);  // 0 for the first child: it leads the group
    if (child_mask_) ::sigprocmask(SIG_SETMASK, &*child_mask_, nullptr);
    if (!spec.log.empty()) {
      const int fd = ::open(spec.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
    }
    for (const auto& [k, v] : spec.env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "[%s] cannot run '%s': %s\n", tag_.c_str(), args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pgid_);  // from both sides: no window in which the child is outside the group
  if (pgid_ == 0) pgid_ = pid;
  members_.push_back(ProcessState{spec.name, pid, spec.log, std::nullopt, 0, {}});
  return members_.size() - 1;
}

std::vector<size_t> ProcessGroup::reap() {
  std::vector<size_t> reaped;
  for (size_t i = 0; i < members_.size(); ++i) {
    ProcessState& m = members_[i];
    if (m.code || m.pid <= 0) continue;
    int status = 0;
    if (::waitpid(m.pid, &status, WNOHANG) != m.pid) continue;
    m.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    m.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + m.signal;
    m.exited = std::chrono::steady_clock::now();
    reaped.push_back(i);
  }
  return reaped;
}

int ProcessGroup::alive() {
  int n = 0;
  for (const auto& m : members_) n += !m.code;
  return n;
}

bool ProcessGroup::wait_all(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    reap();
    if (alive() == 0) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void ProcessGroup::signal_all(int sig) {
  if (pgid_ > 0 && alive() > 0) ::kill(-pgid_, sig);  // with no member left the id may be another process's
}

void ProcessGroup::terminate(int sig, std::chrono::milliseconds grace) {
  signal_all(sig);
  if (!wait_all(grace)) kill_all();
}

void ProcessGroup::kill_all() {
  if (pgid_ > 0 && alive() > 0) ::kill(-pgid_, SIGKILL);
  for (auto& m : members_) {
    if (m.code || m.pid <= 0) continue;
    ::kill(m.pid, SIGKILL);  // also a member that left the group (setpgid of its own)
    int status = 0;
    ::waitpid(m.pid, &status, 0);
    m.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    m.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + m.signal;
    m.exited = std::chrono::steady_clock::now();
  }
}

std::map<std::string, std::string> rank_env(int n, int rank, int port) {
  return {{"COMMSCHED_NUM_WORKERS", std::to_string(n)},
          {"COMMSCHED_RANK", std::to_string(rank)},
          {"COMMSCHED_ROOT_ADDR", "127.0.0.1"},
          {"COMMSCHED_ROOT_PORT", std::to_string(port)},
          {"COMMSCHED_LOCAL_RANK", std::to_string(rank)},
          {"COMMSCHED_LOCAL_SIZE", std::to_string(n)}};
}

RankProcesses::RankProcesses(const std::string& binary, const std::vector<std::string>& args, int n,
                             const std::map<std::string, std::string>& env) {
  const int port = free_loopback_port();
  std::vector<std::string> argv{binary};
  argv.insert(argv.end(), args.begin(), args.end());
  for (int rank = 0; rank < n; ++rank) {
    ProcessSpec spec{"rank " + std::to_string(rank), argv, rank_env(n, rank, port), ""};
    for (const auto& [k, v] : env) spec.env[k] = v;
    group_.spawn(spec);
  }
}

std::vector<RankExit> RankProcesses::wait(std::chrono::seconds limit) {
  group_.wait_all(limit);
  group_.kill_all();
  std::vector<RankExit> exits;
  for (size_t i = 0; i < group_.members().size(); ++i) {
    const ProcessState& m = group_.members()[i];
    exits.push_back(RankExit{static_cast<int>(i), m.signal == 0, m.signal == 0 ? *m.code : m.signal, m.exited});
  }
  return exits;
}

}  // namespace commsched
