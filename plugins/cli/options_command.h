// `commsched options`: the option registry (every COMMSCHED_* variable), the policy and the backend registries.
// `commsched env`: which launcher this environment shows and the cluster contract derived from it.
#pragma once

#include <CLI/CLI.hpp>

namespace commsched {

void add_options_subcommand(CLI::App& app);
void add_env_subcommand(CLI::App& app);

}  // namespace commsched
