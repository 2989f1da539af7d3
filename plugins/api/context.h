// Context: the composition root (DESIGN.md, "Conventions"). It reads the configuration (the cluster contract, the
// engine options, the backend choice), builds the backend, the policy, the Engine and the online tuner, and owns them.
// It is the only place that does: the Python module (one default Context for the Horovod-style API), `commsched run`
// (loopback ranks as threads: Context::loopback_group) and its parameter-server workers, and the benchmarks that run
// the engine (bench/collective/engine_bench) all ask a Context for their engine. C++ programs may build their own.
//
//   COMMSCHED_BACKEND   ps | gloo | loopback | nccl
//                       default: ps when the cluster contract names servers (COMMSCHED_NUM_SERVERS > 0, as
//                       `commsched launch` sets it); loopback with one rank when nothing is set, so a plain
//                       single-process script works unchanged; gloo for several workers and no servers
//                       (`commsched launch -s 0`).
//   COMMSCHED_TUNE      0|1 (default 0): auto-tune partition size, credit and fusion bound live with the online
//                       Bayesian tuner (COMMSCHED_TUNER_* options); rank 0 decides, every rank switches at the same step.
//   COMMSCHED_LINK_PROBE auto|off (default auto): when tuning, the link is timed through the backend at construction
//                       (plugins/api/link_probe.h) for the tuner's warm start.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/loopback/loopback_backend.h"
#include "plugins/api/live_tuner_warm_start.h"
#include "scheduler/config.h"
#include "scheduler/engine.h"
#include "tuner/tuner_config.h"

namespace commsched {
class LiveTuner;
}

namespace commsched {

enum class BackendKind { ps, gloo, loopback, nccl };
std::string_view backend_kind_name(BackendKind b);
BackendKind parse_backend_kind(std::string_view var, std::string_view value);

struct ContextOptions {
  // Explicit engine options by name, applied over the environment: {"policy", "wfbp"}, {"partition_bytes", "1MiB"}.
  std::map<std::string, std::string> engine;
  // Backend override ("ps", "gloo", "loopback", "nccl"); empty: COMMSCHED_BACKEND or the default rule above.
  std::string backend;
  // Auto-tuning override; unset: COMMSCHED_TUNE.
  std::optional<bool> tune;
  // The cluster this Context joins; unset: ClusterEnv::from_env(). The Python plugin's process sets give each set
  // its own Context over a sub-cluster of the workers (its own rendezvous port, ranks renumbered within the set).
  std::optional<ClusterEnv> cluster;
  // A complete engine configuration in place of the environment's (EngineConfig::from_env()), for entry points with
  // flags of their own (`commsched run`, benchmarks); `engine` still applies over it. Knobs it marks unset
  // (partition_set / credit_set false) get the automatic ones on a parameter server, as the environment's do.
  std::optional<EngineConfig> engine_config;
  // The tuner's options when tuning; unset: TunerOptions::from_env(). An entry point with defaults of its own passes
  // TunerOptions::from_env(its defaults), so COMMSCHED_TUNER_* still override them.
  std::optional<tuner::TunerOptions> tuner;
};

// Wall time of the optimizer steps seen so far (what the auto-tuner will consume).
struct StepStats {
  uint64_t steps = 0;          // iteration_end() calls
  double last_step_s = 0;      // wall time between the last two iteration_end() calls (0 before the second)
  double total_step_s = 0;     // sum over every measured step
};

class Context {
 public:
  // Reads the environment, applies `options`, connects the backend (blocks until the cluster's rendezvous is done) and
  // starts the engine. Throws InvalidArgument for a bad configuration (naming the variable and value) and
  // std::runtime_error when the backend cannot connect.
  explicit Context(const ContextOptions& options = {});
  // `ranks` Contexts over one in-process loopback group whose links follow `link` (ranks as threads of one process:
  // `commsched run --backend loopback`, tests); element r is rank r. `options.cluster` and `options.backend` are
  // ignored (the group is the cluster).
  static std::vector<std::unique_ptr<Context>> loopback_group(int ranks, LinkModel link,
                                                              const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return env_.local_rank; }
  int local_size() const { return env_.local_size; }
  BackendKind backend_kind() const { return backend_kind_; }
  const ClusterEnv& cluster() const { return env_; }
  const EngineConfig& engine_config() const { return config_; }
  // The reduction this backend carries: push_pull on the parameter server, allreduce on the collectives.
  Op reduce_op() const { return reduce_op_; }
  // Whether CUDA tensors travel through the device-copy stage (pinned host staging): a build with CUDA and a backend
  // that carries host memory only. CUDA tasks should then carry Buffer::ready_event instead of a synced stream.
  bool stages_device_copies() const { return stages_device_copies_; }

  // Throws std::logic_error after shutdown().
  Engine& engine();

  // Called by the plugin once per optimizer step (after the step's gradients were submitted). Measures the step's wall
  // time; this is where the online auto-tuner observes throughput and changes knobs.
  void iteration_end();
  // As iteration_end(), with the step's wall time measured by the caller (> 0; an emulated training loop that times
  // its own iterations). The tuner starts at the first such call.
  void iteration_end_measured(double step_seconds);
  StepStats step_stats() const { return stats_; }

  // The model's gradient sizes in bytes, in forward order: its signature keys the tuner's store of best
  // configurations (see tuner::model_signature), and with note_backward() they are what the tuner's warm start
  // simulates. Call before the first iteration_end(); optional.
  void set_model(std::span<const uint64_t> tensor_bytes);
  // When each gradient of set_model()'s tensors became ready in one backward (seconds on any clock; negative: not
  // seen). Wanted while wants_backward_times() (rank 0, tuning, before the tuner starts at the first step's end);
  // the tuner then starts from the knobs the simulator predicts fastest for this model, its measured backward, the
  // cluster's shape and the link (plugins/api/live_tuner_warm_start.h).
  void note_backward(std::vector<double> ready_s) { backward_samples_.add(std::move(ready_s)); }
  bool wants_backward_times() const { return tune_ && !tuner_ && rank_ == 0 && size_ > 1; }
  // The compute per layer known in advance (a model profile, as `commsched run` replays one): the warm start
  // simulates it in place of a measured backward, with the same link (measured when probed) and the same rule for
  // where tuning starts. Rank 0's is the one that counts; call before the first iteration_end().
  void set_compute_profile(sim::ModelProfile profile) { compute_profile_ = std::move(profile); }
  // The link the warm start simulates: estimated at construction (what the automatic knobs use), then, when tuning on
  // a real cluster with COMMSCHED_LINK_PROBE=auto, measured through the backend before the constructor returns.
  const LinkEstimate& link() const { return link_; }
  bool tuning() const { return tune_; }
  // The auto-tuner, once the first step has ended with tuning on; null otherwise.
  const LiveTuner* tuner() const { return tuner_.get(); }
  // Whether the tuner has no more trials to run: true when tuning is off, false before its first step.
  bool tuning_finished() const;

  // Waits for nothing: pending tasks fail with 'cancelled'. Idempotent; the destructor calls it.
  void shutdown();
  bool is_shut_down() const { return engine_ == nullptr; }

 private:
  using Clock = std::chrono::steady_clock;

  // `backend`: a backend built by the caller (a loopback group's rank); null: the one the configuration names.
  Context(const ContextOptions& options, std::shared_ptr<CommBackend> backend);
  void end_step(double step_seconds);
  void start_tuner();
  std::optional<LiveWarmStart> plan_warm_start() const;
  void probe_link(const std::string& mode);  // COMMSCHED_LINK_PROBE's value

  ClusterEnv env_;
  EngineConfig config_;
  BackendKind backend_kind_ = BackendKind::loopback;
  Op reduce_op_ = Op::push_pull;
  bool stages_device_copies_ = false;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<Engine> engine_;
  bool tune_ = false;
  LinkEstimate link_;
  std::vector<uint64_t> tensor_bytes_;
  BackwardSamples backward_samples_;
  std::optional<sim::ModelProfile> compute_profile_;  // set_compute_profile
  std::optional<tuner::TunerOptions> tuner_options_;  // parsed at construction when tuning
  uint64_t model_signature_ = 0;
  std::unique_ptr<LiveTuner> tuner_;
  StepStats stats_;
  Clock::time_point last_step_end_{};
};

}  // namespace commsched
