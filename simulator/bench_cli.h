// `commsched bench`: runs the comparison grid and writes CSV, JSON, Markdown and timeline data (plots via simulator/plot.py).
// --mode sim simulates it; --mode cluster runs each cell as a real local parameter-server cluster (through a
// ClusterTrial the executable provides) and sets the simulator's predictions beside it (simulator/cluster_bench.cc).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace commsched {

// One real run of a cell: W workers and S servers on this machine, compute emulated by sleeping per layer of the
// profile; links EMULATED (the transport's token bucket, COMMSCHED_EMULATE_RATE) or, with links "netns", real links
// shaped with tbf between network namespaces (root).
struct ClusterTrialSpec {
  std::string model;      // profile name or .json path
  std::string bandwidth;  // as given, e.g. "0.5gbit"
  int workers = 2;
  int servers = 2;
  std::string policy;
  std::string partition, credit, small_tensor;  // bytescheduler's knobs, as option values
  int iterations = 4;     // measured
  int warmup = 2;
  std::string links = "emulated";  // or "netns"
  bool auth = true;                // netns: a fresh secret per trial (false: COMMSCHED_AUTH=off)
};
// Runs one trial; returns worker 0's measured iteration times in seconds (throws on failure).
using ClusterTrial = std::function<std::vector<double>(const ClusterTrialSpec&)>;

// Adds the `bench` subcommand to `app`; its callback runs the grid when the subcommand is given. Without `cluster`,
// --mode cluster is refused with a message naming the executable that has it (--resimulate still works).
void add_bench_subcommand(CLI::App& app, ClusterTrial cluster = {});

}  // namespace commsched
