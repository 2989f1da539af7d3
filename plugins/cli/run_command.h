// `commsched run`: the main job. Runs a model profile through the engine with the WFBP baseline and with the
// scheduler, on the loopback backend (ranks as threads, modelled links) or on a local parameter-server cluster
// (`--backend ps`: servers and workers as processes, emulated link rate), and prints both and the speedup.
#pragma once

#include <CLI/CLI.hpp>

#include <vector>

#include "simulator/bench_cli.h"

namespace commsched {

void add_run_subcommand(CLI::App& app);
// The worker side of `run --backend ps` (started by the launcher; not for direct use).
void add_synthetic_worker_subcommand(CLI::App& app);
// One `commsched bench --mode cluster` trial: a local PS cluster running synthetic-worker, as `run --backend ps` does.
std::vector<double> run_cluster_trial(const ClusterTrialSpec& trial);

}  // namespace commsched
