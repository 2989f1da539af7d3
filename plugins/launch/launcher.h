// A parameter-server cluster around any command: S servers (this executable's `server` subcommand) and W workers
// (the given command) per node, with the COMMSCHED_* environment contract set. One node: everything on loopback.
// Several nodes (nnodes > 1): every node runs its own launcher with its node rank and its own W and S (nodes may
// differ, as hosts with different slots do); they meet at node 0's launcher (root HOST:PORT, see node_link.h), the
// cluster's rendezvous is HOST:PORT+1, and node i's workers get the global ranks after those of nodes 0..i-1
// (servers likewise). COMMSCHED_HIERARCHICAL, which needs equal machines, is refused with uneven worker counts.
// Ctrl-C (or SIGTERM) is forwarded; when any process on any node exits non-zero, or a node's launcher disappears,
// every node tears its processes down and launch returns non-zero.
// Elastic (min_workers > 0): the launcher (node 0's, across nodes) serves the job's membership store
// (COMMSCHED_ELASTIC_STORE), a worker that fails is marked lost there instead of ending the run, a failed worker is
// started again as a joiner while `restarts` allow, and the run fails only when fewer than min_workers remain.
// Parameter servers keep nothing between rounds: each generation the workers form gets servers of its own (a failed
// server is not the end either). Across nodes (Gloo only) the minimum counts every node's workers (each launcher
// publishes its own in the store), and node 0 survives a lost node (NodeLink::survive_lost_nodes): its workers died
// with their launcher.
#pragma once

#include <map>
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
  // Multi-node (no ssh): nnodes launchers, this one is node_rank; root is node 0's HOST:PORT.
  int nnodes = 1;
  int node_rank = 0;
  std::string root;
  std::string bind;                  // COMMSCHED_BIND for this node's processes; empty: 127.0.0.1 on one node, else auto
  double join_timeout_s = 120;       // how long the launchers wait for each other
  // Stop (as SIGTERM does) when stdin reaches end-of-file: horovodrun's remote hosts, whose ssh (no tty) forwards
  // no signal, keep ssh's stdin open for the run and close it on Ctrl-C or when horovodrun (or its ssh) is gone.
  bool stdin_lifeline = false;
  // Set in every child on every node (node 0's entries are sent to the others when the run starts): the place for
  // per-run settings that all nodes must share.
  std::map<std::string, std::string> extra_env;
  // Elastic training (python/commsched/_elastic.py): 0 = off.
  int min_workers = 0;
  int max_workers = 0;               // 0: no bound
  int restarts = 0;                  // failed workers started again (each joins at the survivors' next commit)
  int join_workers = 0;              // workers started at once as joiners: let in at the first commit
};

// Runs the cluster to completion. Returns 0 when every process exited 0, else the first failing process's exit code
// (128+signal when killed), or 130 after Ctrl-C. Throws InvalidArgument for bad options.
int launch_local_cluster(const LaunchOptions& opts);

}  // namespace commsched
