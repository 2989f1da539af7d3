// Discrete-event simulation of data-parallel training iterations driving a real commsched::Policy with simulated time.
//
// Compute (one stream per worker): forward layer 0..L-1, then backward L-1..0. When a layer's backward ends its tensors
// are submitted as tasks (priority = position in forward order), split with commsched::partition_ranges when the policy
// splits tasks; after layer 0 the policy is told backward_done. The next iteration's forward of layer i waits until
// every tensor of layer i from the previous iteration has finished communicating: that wait is what priority scheduling
// shortens. Communication: each Batch the policy dispatches goes through a NetworkModel, which says when it completes.
// simulate(): workers are symmetric, so one representative worker is simulated (see network.h); the cost is independent
// of W. simulate_each_worker(): every worker of a parameter-server cluster runs on its own, with its own policy, and the
// servers answer them as the real PS does (see ps_cluster.h); the cost grows with W.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "simulator/compression_model.h"
#include "simulator/fabric.h"
#include "simulator/network.h"
#include "workload/profile.h"
#include "scheduler/policy.h"

namespace commsched::sim {

struct SimOptions {
  int iterations = 6;                  // simulated iterations
  int warmup = 1;                      // leading iterations left out of the mean (MG-WFBP learns in the first)
  uint64_t partition_bytes = 4 << 20;  // used when the policy splits tasks; 0: whole tensors
  bool record_timeline = false;        // keep compute and communication spans (for plots)
  // > 0: stop as soon as the measured period is sure to come out above this many seconds (a search that already has
  // a faster candidate need not finish a slower one); the result is then marked `abandoned`.
  double abandon_above_s = 0;
};

struct Span {
  enum class Lane { forward, backward, comm };
  Lane lane;
  int iteration;
  Nanos start;             // comm: when the message started moving (after those dispatched before it)
  Nanos end;
  int32_t first_priority;  // forward/backward: the layer; comm: the most urgent priority in the batch
  int32_t last_priority;
  uint64_t bytes;
  uint32_t parts;
};

struct SimResult {
  std::string policy;
  double iteration_s = 0;             // steady-state mean over iterations warmup..iterations-1
  std::vector<double> iteration_start_s;  // start of each iteration's forward, plus one past the last
  double compute_s = 0;               // forward + backward per iteration
  double comm_bound_s = 0;            // network-only bound for the model's bytes
  double lower_bound_s = 0;           // max(compute, comm bound)
  double dependency_bound_s = 0;      // tighter: also counts gradients needed early but produced late (see below)
  uint64_t batches = 0;               // messages over the whole run
  std::vector<Span> spans;            // when SimOptions::record_timeline
  LinkUse links;                      // busy fractions per kind of link (every PS worker simulated only)
  // Stopped early (SimOptions::abandon_above_s): iteration_s is then only a lower bound of the period, already above
  // the limit, and the other fields cover the run so far.
  bool abandoned = false;
};

// A lower bound that also respects the iteration's dependencies: the gradients of layers 0..i are all produced no
// earlier than layer i's backward ends and must be synchronised before the next forward reaches layer i, so
//   period >= compute + max(0, comm(bytes of layers 0..i) - (backward + forward of layers 0..i-1))   for every i,
// and period >= comm(all bytes). comm() is the network's bound for those bytes at their fewest messages (no latency), so
// no schedule beats it.
// It exceeds max(compute, comm) when a big tensor is needed first and produced last (BERT's and Transformer's
// embeddings), which no scheduler can overlap.
double dependency_bound_s(const ModelProfile& model, const NetworkModel& network);
// comm() above: the network's bound (NetworkModel::comm_lower_bound_s) for the gradients of layers 0..layers-1, at
// the fewest messages their tensors can travel in.
double comm_bound_s(const ModelProfile& model, size_t layers, const NetworkModel& network);

// Runs one simulation. The policy must be fresh (never told an event); the network is reset first.
SimResult simulate(const ModelProfile& model, NetworkModel& network, Policy& policy, const SimOptions& options);

// Makes one fresh policy per simulated worker.
using PolicyFactory = std::function<std::unique_ptr<Policy>()>;

// Every one of params.workers workers simulated on its own (its own compute stream and policy, made by make_policy)
// over the parameter server as ps_cluster.h models it. The result is worker 0's, as rank 0 reports a real run; the
// bounds are PsNetwork(params)'s (with `compression`'s bytes). `compression`: compressed bytes and each stage's time
// on the workers and the servers (ps_cluster.h).
SimResult simulate_each_worker(const ModelProfile& model, const PsParams& params, const PolicyFactory& make_policy,
                               const SimOptions& options, const CompressionModel& compression = {});

}  // namespace commsched::sim
