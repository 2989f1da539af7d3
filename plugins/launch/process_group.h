// Child processes as one POSIX process group: start them (argv, environment, optional log file), reap them without
// blocking, signal them all at once, and always clean up: whatever still runs when the group goes out of scope is
// SIGKILLed and reaped. The launcher, the benches that run ranks as processes and the multi-process tests all start
// their processes here, so "no process is ever left behind" is written once.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm_backends/control/socket.h"

namespace commsched {

// The most ProcessSpec::input may hold: the pipe is made to hold all of it (Linux's default fs.pipe-max-size).
inline constexpr size_t kMaxProcessInput = 1 << 20;

struct ProcessSpec {
  std::string name;                          // "worker 2", "rank 0": how reports name the process
  // argv[0] is the program, looked up when it has no '/' on the PATH `env` sets, else on this process's.
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;    // set on top of this process's environment
  std::string log;                           // stdout+stderr go to this file; empty: inherited
  // SIGKILLed when the thread that spawned it exits (PR_SET_PDEATHSIG), so a launcher killed outright (SIGKILL, an
  // OOM kill) leaves no worker behind to hang on its peers. Only for a caller that spawns from a thread living as
  // long as the process: the signal follows the spawning thread, not the process.
  bool dies_with_parent = false;
  // Written to the child's stdin (a pipe, closed after it; at most kMaxProcessInput) for what must not appear on a
  // command line, which any user of the host can read (a secret handed through ssh). Empty: stdin is inherited.
  std::string input = {};
  // With input: the pipe stays open after it until close_inputs() or the group's end (this process's exit included),
  // so that the child sees end-of-file on stdin only then: a lifeline for what no signal reaches (ssh without a tty).
  bool keep_input_open = false;
};

struct ProcessState {
  std::string name;
  pid_t pid = -1;
  std::string log;
  // Set once reaped: the exit status, or 128+signal when killed (the shell's convention).
  std::optional<int> code;
  int signal = 0;                            // the terminating signal, 0 after a normal exit
  std::chrono::steady_clock::time_point exited;
};

class ProcessGroup {
 public:
  // `child_mask`: the signal mask children start with (a caller that blocks signals to wait for them synchronously
  // hands its old mask, so children get the ordinary one). `tag` prefixes the message a child prints when its
  // program cannot be run.
  explicit ProcessGroup(std::optional<sigset_t> child_mask = std::nullopt, std::string tag = "commsched");
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts one process in the group; returns its index in members(). Throws std::runtime_error when fork fails. The
  // child gets descriptors 0-2 only (stdout and stderr to the log when there is one). Reads this process's
  // environment: not while another thread calls setenv or putenv.
  size_t spawn(const ProcessSpec& spec);
  // Reaps every member that has exited, without blocking; returns the indices reaped by this call, in order.
  std::vector<size_t> reap();
  // Polls reap() until every member has exited or `limit` passes; true when all exited.
  bool wait_all(std::chrono::milliseconds limit);
  // Sends `sig` to every process of the group.
  void signal_all(int sig);
  // Sends `sig`, waits up to `grace` for the group to exit, then SIGKILLs and reaps what is left.
  void terminate(int sig, std::chrono::milliseconds grace);
  // SIGKILLs every member not yet reaped and reaps it (blocking).
  void kill_all();
  // Closes the stdin pipes kept open (ProcessSpec::keep_input_open): their children read end-of-file.
  void close_inputs() { open_inputs_.clear(); }

  const std::vector<ProcessState>& members() const { return members_; }
  ProcessState& member(size_t i) { return members_.at(i); }
  int alive();  // members not yet reaped (after a reap())

 private:
  std::optional<sigset_t> child_mask_;
  std::string tag_;
  pid_t pgid_ = 0;
  std::vector<ProcessState> members_;
  std::vector<control::Fd> open_inputs_;  // keep_input_open: the write ends
};

// For a forked child, before exec (async-signal-safe, no allocation): closes every descriptor above stderr that
// /proc/self/fd lists; false where /proc cannot be read. What spawn's child does where close_range is missing or
// refused; declared here so that this fallback is tested on kernels where close_range works.
bool close_listed_fds();

// A loopback TCP port nobody listens on, for the processes a launcher starts (control::free_port's rule).
inline int free_loopback_port() { return control::free_port("127.0.0.1"); }

// The environment contract (see comm_backends/cluster_env.h) of rank `rank` of `n` meeting at 127.0.0.1:`port`, all
// on this host (local rank = rank: one GPU each where there are GPUs).
std::map<std::string, std::string> rank_env(int n, int rank, int port);

struct RankExit {
  int rank = -1;
  bool exited = false;  // normal exit (see code) as opposed to a signal
  int code = -1;        // exit code, or the signal number
  std::chrono::steady_clock::time_point when;
};

// N copies of one program on loopback, rank i with rank_env(n, i, port) on a fresh port, plus `env` for all.
class RankProcesses {
 public:
  RankProcesses(const std::string& binary, const std::vector<std::string>& args, int n,
                const std::map<std::string, std::string>& env = {});
  // Waits until every rank has exited or `limit` passes (then kills the rest). Returns one entry per rank.
  std::vector<RankExit> wait(std::chrono::seconds limit);

 private:
  ProcessGroup group_;
};

}  // namespace commsched
