// Internal to `commsched bench` (bench_cli.cc: the options and --mode sim; cluster_bench.cc: --mode cluster): the raw
// option values and the helpers both modes use.
#pragma once

#include <array>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "options/knobs.h"
#include "scheduler/policy_factory.h"
#include "scheduler/reply_order.h"
#include "simulator/bench_cli.h"
#include "simulator/grid.h"

namespace commsched::bench {

// Raw option values; parsed with the project's value parsers so errors name the option and the value.
struct BenchArgs {
  std::string mode = "sim";
  std::vector<std::string> models = {"vgg16", "resnet50", "bert-base", "bert-large", "transformer-base"};
  std::string profiles_dir = COMMSCHED_PROFILES_DIR;
  std::vector<std::string> bandwidths = {"1Gbit", "10Gbit", "25Gbit", "100Gbit"};
  std::vector<int> workers = {8};
  int servers = 0;
  std::string network = "ps";
  std::string latency = "25us";
  std::string ps_chunk = "4MiB";
  std::string ps_message_cost = std::to_string(int(std::lround(kPsMessageS * 1e9))) + "ns";
  std::string ring_alpha = "5us";
  std::vector<std::string> policies = policy_names();  // every registered policy
  // Per knob row (options/knobs.h), its grid flag's values; empty: the network's default grid.
  std::array<std::vector<std::string>, kKnobCount> grid;
  int tune = 0;
  bool emulated_links = false;
  std::string link_model = "fifo";
  uint64_t ps_reply_bound = ReplyOrder<int>::kDefaultMaxOvertakes;
  std::string ps_workers = "auto";
  std::string compression = "none";
  std::vector<std::string> stage_costs;  // encode, decode per MiB; empty: measured_compression's
  std::string fusion_bytes = "64MiB";
  std::string fusion_cycle = "5ms";
  int iterations = 12;
  int warmup = 4;
  std::string out_dir = "bench-results";
  bool plot = false;
  int threads = 0;  // simulations run at once; 0: every core
  // --mode cluster
  int trials = 3;
  int trial_iterations = 4;
  int trial_warmup = 2;
  int attempts = 3;
  std::string links = "emulated";  // or netns
  std::string auth = "on";         // netns: on (a fresh secret per trial) or off
  double link_efficiency = 0;      // payload share of the shaped rate given to the simulator; 0: by --links
  std::string resimulate;          // an earlier cluster.csv whose real cells are simulated again, none run
};


// The grid the options describe (every value parsed; errors name the option).
sim::GridSpec to_spec(const BenchArgs& a);
// Writes `body` to `p`; a file that cannot be opened is an error naming it.
void write_file(const std::filesystem::path& p, const std::function<void(std::ostream&)>& body);
// With --plot, draws the PNGs of the results in `dir`.
void draw_plots(const BenchArgs& a, const std::filesystem::path& dir);
// "12 of 40 cells, 35 s so far, about 80 s left".
std::string progress(size_t done, size_t total, std::chrono::steady_clock::time_point t0);
// --mode cluster (cluster_bench.cc).
void run_cluster_bench(const BenchArgs& a, const ClusterTrial& trial);

}  // namespace commsched::bench
