// The `commsched` command-line tool.
//   commsched run      a model profile through the engine, WFBP against the scheduler, on loopback or a local PS cluster
//   commsched launch   a local parameter-server cluster around any command
//   commsched horovodrun  horovodrun's command line: one launch per host, over ssh
//   commsched server   one parameter server (roles from the environment contract)
//   commsched bench    the comparison grid: simulated, or run as real local clusters (--mode cluster)
//   commsched trace-merge  the per-rank trace files of one run as one Perfetto trace
//   commsched options  every COMMSCHED_* option (--markdown: the README table), the policies, the backends
//   commsched env      the launcher detected (torchrun/Ray, Slurm, Open MPI, DMLC_*) and the cluster contract derived
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string_view>

#include "plugins/cli/options_command.h"
#include "simulator/bench_cli.h"
#include "simulator/huge_pages.h"
#include "plugins/cli/run_command.h"
#include "plugins/cli/trace_merge.h"
#include "plugins/launch/horovodrun.h"
#include "plugins/launch/launch_cli.h"

int main(int argc, char** argv) {
  // `bench` simulates as commsched-sim does: its heap on huge pages (see huge_pages.h). The other commands start as
  // they are (a launcher's children inherit the environment).
  if (argc > 1 && std::string_view(argv[1]) == "bench") commsched::restart_with_huge_pages(argv);
  CLI::App app{"commsched: a communication scheduler for distributed deep-learning training"};
  app.require_subcommand(1);
  commsched::add_run_subcommand(app);
  commsched::add_synthetic_worker_subcommand(app);
  commsched::add_launch_subcommand(app);
  commsched::add_horovodrun_subcommand(app);
  commsched::add_server_subcommand(app);
  commsched::add_bench_subcommand(app, commsched::run_cluster_trial);
  commsched::add_trace_merge_subcommand(app);
  commsched::add_options_subcommand(app);
  commsched::add_env_subcommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "commsched: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
