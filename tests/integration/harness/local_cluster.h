// The multi-process test harness: a cluster of real processes on loopback (servers, if any, and workers; one log file
// each), for the PS integration tests and the conformance suite.
// The processes are one ProcessGroup (plugins/launch/process_group.h): the destructor kills (SIGKILL) and reaps them,
// so a failing test never leaves processes behind.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plugins/launch/process_group.h"

namespace commsched::testing {

struct Proc {
  std::string name;  // "worker 2", "server 0"
  pid_t pid = -1;
  std::string log;   // stderr+stdout file
  std::optional<int> exit_code;  // set once reaped: exit status, or 128+signal
  std::chrono::steady_clock::time_point exited;
};

class LocalCluster {
 public:
  // exe: the binary run for both roles (it dispatches on COMMSCHED_ROLE); args: extra worker arguments.
  LocalCluster(std::string exe, int workers, int servers, std::vector<std::string> worker_args,
               std::map<std::string, std::string> extra_env = {});
  // Kills what is left and removes the folder of logs, unless COMMSCHED_TEST_KEEP_LOGS is set (to read the logs of
  // passing runs, which the tests print only on failure).
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  void start();
  // Waits until every process has exited or the timeout passes; returns true when all exited.
  bool wait_all(std::chrono::milliseconds timeout);
  void kill9(const std::string& name);
  std::vector<Proc>& procs() { return procs_; }
  Proc& proc(const std::string& name);
  std::string read_log(const std::string& name) const;
  int root_port() const { return port_; }
  std::string dir() const { return dir_; }
  // Number of our processes still alive (not yet reaped).
  int alive();

 private:
  void spawn(const std::string& role, int rank, const std::string& log, const std::vector<std::string>& args);
  void reap();

  std::string exe_;
  int workers_, servers_;
  std::vector<std::string> worker_args_;
  std::map<std::string, std::string> env_;
  std::string dir_;
  int port_ = 0;
  ProcessGroup group_;
  std::vector<Proc> procs_;  // one per member of group_, in the same order
};

int free_tcp_port();

}  // namespace commsched::testing
