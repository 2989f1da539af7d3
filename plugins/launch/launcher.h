// A local parameter-server cluster around any command: S servers (this executable's `server` subcommand) and W
// workers (the given command), all on loopback with the COMMSCHED_* environment contract set. Ctrl-C (or SIGTERM) is
// forwarded; when any process exits non-zero, the whole cluster is torn down and launch returns non-zero.
#pragma once

#include <string>
#include <vector>

namespace commsched {

struct LaunchOptions {
  int workers = 1;
  int servers = 1;
  std::string emulate_rate;          // passed on as COMMSCHED_EMULATE_RATE (EMULATION), empty: unchanged
  bool deterministic = false;        // COMMSCHED_PS_DETERMINISTIC=1
  std::vector<std::string> command;  // the worker command (argv)
  std::string server_exe;            // empty: /proc/self/exe
  std::vector<std::string> server_args = {"server"};
  double grace_s = 5;                // SIGTERM -> SIGKILL delay when tearing down
};

// Runs the cluster to completion. Returns 0 when every process exited 0, else the first failing process's exit code
// (128+signal when killed), or 130 after Ctrl-C. Throws InvalidArgument for bad options.
int launch_local_cluster(const LaunchOptions& opts);

}  // namespace commsched
