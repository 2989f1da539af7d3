// `commsched options`: the option registry (every COMMSCHED_* variable), the policy and the backend registries.
#pragma once

#include <CLI/CLI.hpp>

namespace commsched {

void add_options_subcommand(CLI::App& app);

}  // namespace commsched
