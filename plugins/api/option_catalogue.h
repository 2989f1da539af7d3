// The catalogue of the option registry: every option table of the product in one list, from which the CLI
// (`commsched options`), the Python keywords (commsched._C.options()) and the README table are generated.
#pragma once

#include <string>
#include <vector>

#include "options/option_table.h"

namespace commsched {

// Options the composition root reads itself (which backend, whether to tune).
struct ContextEnvOptions {
  std::string backend;  // COMMSCHED_BACKEND; empty: chosen from the cluster's shape
  bool tune = false;    // COMMSCHED_TUNE
  std::string link_probe = "auto";  // COMMSCHED_LINK_PROBE: auto (time the link at startup when tuning) | off
  bool cross_iteration = true;       // COMMSCHED_CROSS_ITERATION: the framework optimizers' default (Python reads it)
  static ContextEnvOptions from_env();
};
const OptionTable<ContextEnvOptions>& context_option_table();

// Every option, table by table: engine, context, tuner, parameter server, collective, cluster contract.
std::vector<OptionInfo> all_options();

// The README's options table (Markdown), exactly as `commsched options --markdown` prints it.
std::string options_markdown();
// The policy and backend registries as Markdown tables (`commsched options --policies` / `--backends`).
std::string policies_markdown();
std::string backends_markdown();

}  // namespace commsched
