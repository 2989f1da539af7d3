#include "plugins/launch/process_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace commsched {

ProcessGroup::ProcessGroup(std::optional<sigset_t> child_mask, std::string tag)
    : child_mask_(child_mask), tag_(std::move(tag)) {}

ProcessGroup::~ProcessGroup() { kill_all(); }

// close_range's fallback in the child (kernels before 5.9 lack close_range, some container seccomp profiles refuse
// it): /proc/self/fd read with the bare system call into a stack buffer.
bool close_listed_fds() {
  const int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(dirent64) char buf[4096];
  for (ssize_t n; (n = ::getdents64(dir, buf, sizeof buf)) > 0;)
    for (ssize_t at = 0; at < n; at += reinterpret_cast<dirent64*>(buf + at)->d_reclen) {
      int fd = 0;
      const char* name = reinterpret_cast<dirent64*>(buf + at)->d_name;
      for (; *name >= '0' && *name <= '9'; ++name) fd = fd * 10 + (*name - '0');
      if (*name == '\0' && fd > 2 && fd != dir) ::close(fd);  // "." and ".." are not numbers
    }
  ::close(dir);
  return true;
}

namespace {

// argv and the environment as execvpe() takes them, built before fork(): the child of a threaded process may only
// make async-signal-safe calls (setenv or a std::string could take a lock another thread held at the fork).
struct ExecArgs {
  std::string program;  // argv[0], or where the spec's own PATH finds it
  std::vector<std::string> env;
  std::vector<char*> argv, envp;

  explicit ExecArgs(const ProcessSpec& spec) {
    // execvpe searches this process's PATH; a PATH the spec sets is the child's, so the program is looked up there
    // (and not found, rather than found on this process's PATH, when it is not there).
    const auto path = spec.env.find("PATH");
    program = path == spec.env.end() ? spec.argv[0] : on_path(spec.argv[0], path->second);
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view kv(*e);
      if (!spec.env.contains(std::string(kv.substr(0, kv.find('='))))) env.emplace_back(kv);
    }
    for (const auto& [k, v] : spec.env) env.push_back(k + "=" + v);
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
  }

  // `prog` as the first executable file of that name in `path`'s directories (an empty one is the current
  // directory); unchanged when it names a path; "" when none has it.
  static std::string on_path(const std::string& prog, const std::string& path) {
    if (prog.find('/') != std::string::npos) return prog;
    for (size_t start = 0;;) {
      const size_t end = path.find(':', start);
      const std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
      const std::string candidate = (dir.empty() ? "." : dir) + "/" + prog;
      struct stat st {};
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
        return candidate;
      if (end == std::string::npos) return {};
      start = end + 1;
    }
  }
};

// In the child: every descriptor above stderr closed, so a child holds none of the parent's sockets (a worker's
// listening port, a rank's connections) open after the parent closes them, whether or not they were opened CLOEXEC.
void close_inherited_fds() {
  if (::close_range(3, ~0U, 0) == 0 || close_listed_fds()) return;
  for (int fd = 3; fd < 65536; ++fd) ::close(fd);  // no /proc either: the descriptors a process usually has
}

// In the child: "<what><why>\n" on stderr, with write(2) only.
void say(const std::string& what, int err) {
  for (const char* s : {what.c_str(), ::strerrordesc_np(err), "\n"})
    if (s != nullptr) (void)!::write(2, s, std::strlen(s));
}

struct Pipe {
  control::Fd read, write;
};

// The pipe a child's stdin reads ProcessSpec::input from; none when there is no input.
Pipe input_pipe(const ProcessSpec& spec) {
  Pipe p;
  if (spec.input.empty()) return p;
  const size_t size = spec.input.size();
  if (size > kMaxProcessInput)
    throw std::runtime_error("the input for " + spec.name + " is " + std::to_string(size) + " bytes; at most " +
                             std::to_string(kMaxProcessInput) + " go through its stdin");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 for " + spec.name + ": " + std::strerror(errno));
  p.read.reset(fds[0]);
  p.write.reset(fds[1]);
  // All of it must fit: it is written at once, with no reader but this process (a write that waited would wait
  // for a child that may never read). A user over the kernel's pipe limits gets smaller pipes, so ask.
  int capacity = ::fcntl(fds[1], F_GETPIPE_SZ);
  if (capacity >= 0 && static_cast<size_t>(capacity) < size)
    capacity = ::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(size));
  if (capacity < 0 || static_cast<size_t>(capacity) < size)
    throw std::runtime_error("no pipe holds the " + std::to_string(size) + " bytes of input for " + spec.name +
                             " (fs.pipe-max-size, or this user's pipe limit): " + std::strerror(errno));
  return p;
}

void write_input(Pipe& p, const std::string& text) {
  for (size_t done = 0; p.write.valid() && done < text.size();) {
    const ssize_t n = ::write(p.write.get(), text.data() + done, text.size() - done);
    if (n <= 0 && errno != EINTR) break;
    if (n > 0) done += static_cast<size_t>(n);
  }
}

}  // namespace

size_t ProcessGroup::spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) throw std::runtime_error(tag_ + ": no program given for " + spec.name);
  // A group lives while one of its members does (a zombie not yet reaped included). Once every member has been
  // reaped (an elastic run starting a worker again after all others exited), the next child leads a new group: the
  // old id may belong to another process by now.
  if (alive() == 0) pgid_ = 0;
  ExecArgs exec(spec);
  const std::string cannot_run = "[" + tag_ + "] cannot run '" + spec.argv[0] + "': ";
  const std::string cannot_log = "[" + tag_ + "] cannot write the log " + spec.log + " of " + spec.name + ": ";
  const pid_t parent = ::getpid();
  Pipe input = input_pipe(spec);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(tag_ + ": fork failed: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    if (input.read.valid()) ::dup2(input.read.get(), 0);
    // A parent gone before the prctl took effect would never send the signal: then the child goes at once.
    if (spec.dies_with_parent && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)) ::_exit(137);
    ::setpgid(0, pgid_);  // 0 for the first child: it leads the group
    if (child_mask_) ::sigprocmask(SIG_SETMASK, &*child_mask_, nullptr);
    if (!spec.log.empty()) {
      const int fd = ::open(spec.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
      else say(cannot_log, errno);
    }
    close_inherited_fds();
    if (exec.program.empty()) errno = ENOENT;  // not on the spec's PATH
    else ::execvpe(exec.program.c_str(), exec.argv.data(), exec.envp.data());
    say(cannot_run, errno);
    ::_exit(127);
  }
  // Written while this process still holds the read end too: a child already gone cannot raise SIGPIPE here, and
  // the text fits the pipe's buffer, so the write never waits for the child.
  write_input(input, spec.input);
  input.read.reset();
  if (spec.keep_input_open && input.write.valid()) open_inputs_.push_back(std::move(input.write));
  input.write.reset();
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
