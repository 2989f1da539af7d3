// CLI subcommands of the parameter server, wired into `commsched` by plugins/cli:
//   commsched launch -w 4 -s 2 [--emulate-rate 1gbit] [--deterministic] -- <worker command...>
//   commsched server        (one parameter server; role, rank and rendezvous from the COMMSCHED_*/DMLC_* variables)
#pragma once

#include <CLI/CLI.hpp>

namespace commsched {

void add_launch_subcommand(CLI::App& app);
void add_server_subcommand(CLI::App& app);

}  // namespace commsched
