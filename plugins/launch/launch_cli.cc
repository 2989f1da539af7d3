#include "plugins/launch/launch_cli.h"

#include <iostream>
#include <memory>

#include "comm_backends/cluster_env.h"
#include "comm_backends/launcher_env.h"
#include "comm_backends/ps/ps_config.h"
#include "comm_backends/ps/server.h"
#include "plugins/launch/launcher.h"
#include "scheduler/config.h"

namespace commsched {

void add_launch_subcommand(CLI::App& app) {
  auto opts = std::make_shared<LaunchOptions>();
  CLI::App* sub = app.add_subcommand("launch", "run a command as W workers with S parameter servers per node "
                                               "(this host, or --nnodes hosts each running launch)");
  sub->add_option("-w,--workers", opts->workers, "number of worker processes")->check(CLI::PositiveNumber);
  sub->add_option("-s,--servers", opts->servers,
                  "number of parameter-server processes (0: workers only, for all-reduce backends such as gloo)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--emulate-rate", opts->emulate_rate,
                  "EMULATED link rate per process (token bucket on sends), e.g. 1gbit; not a real link");
  sub->add_flag("--deterministic", opts->deterministic, "servers sum in rank order (bitwise reproducible)");
  sub->add_option("--nnodes", opts->nnodes, "number of nodes, each running its own `commsched launch` (default 1)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--node-rank", opts->node_rank, "this node's index in [0, nnodes)")->check(CLI::NonNegativeNumber);
  sub->add_option("--root", opts->root, "node 0's HOST:PORT where the launchers meet (the cluster's rendezvous is "
                                        "PORT+1); required with --nnodes > 1");
  sub->add_option("--bind", opts->bind, "address or interface this node's processes bind (default: 127.0.0.1 on "
                                        "one node, else the address that reaches the root)");
  sub->add_option("--join-timeout", opts->join_timeout_s, "seconds to wait for every node's launcher (default 120)");
  sub->add_flag("--stdin-lifeline", opts->stdin_lifeline,
                "stop the run, as SIGTERM would, when stdin reaches end-of-file (horovodrun's remote hosts: ssh "
                "without a tty forwards no Ctrl-C, but closes stdin)");
  sub->add_option("--min-workers", opts->min_workers,
                  "elastic training: a failed worker no longer ends the run; the survivors continue until fewer than "
                  "this many remain (across nodes: Gloo only, -s 0)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-workers", opts->max_workers, "elastic training: at most this many workers at once")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--restarts", opts->restarts,
                  "elastic training: start a failed worker again, up to this many times in all; it joins the "
                  "survivors at their next commit")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--join-workers", opts->join_workers,
                  "elastic training: start this many more workers as joiners; they join at the first commit")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("command", opts->command, "worker command, after --")->required()->expected(-1);
  sub->callback([opts] {
    int rc = 2;
    try {
      if (!opts->emulate_rate.empty()) parse_rate_bps("--emulate-rate", opts->emulate_rate, true);  // fail early
      rc = launch_local_cluster(*opts);
    } catch (const std::exception& e) {
      std::cerr << "commsched launch: " << e.what() << std::endl;
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

void add_server_subcommand(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("server", "run one parameter server (configured by COMMSCHED_* variables)");
  sub->callback([] {
    if (const std::string notice = scheduler_role_notice(); !notice.empty()) {
      std::cout << notice << std::endl;  // BytePS job files start a scheduler; commsched has none to run
      return;
    }
    ClusterEnv env;
    PsConfig cfg;
    try {
      env = ClusterEnv::from_env();
      cfg = PsConfig::from_env();
    } catch (const std::exception& e) {
      std::cerr << "commsched server: " << e.what() << std::endl;
      throw CLI::RuntimeError(2);
    }
    if (env.role != Role::server) {
      std::cerr << "commsched server: COMMSCHED_ROLE (or DMLC_ROLE) must be 'server'" << std::endl;
      throw CLI::RuntimeError(2);
    }
    int rc = 1;
    try {
      rc = run_server(env, cfg, /*owns_process=*/true);
    } catch (const std::exception& e) {
      std::cerr << "commsched server " << env.rank << ": " << e.what() << std::endl;
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace commsched
