#include "plugins/api/context.h"

#include <cmath>
#include <iostream>
#include <stdexcept>

#include "base/cpu_usage.h"
#include "comm_backends/backend_registry.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/comm_backend.h"
#include "comm_backends/loopback/loopback_backend.h"
#include "plugins/api/link_probe.h"
#include "plugins/api/live_tuner.h"
#include "plugins/api/option_catalogue.h"
#include "scheduler/auto_knobs.h"
#include "scheduler/policy_factory.h"
#include "scheduler/stages/device_copy_stage.h"
#ifdef COMMSCHED_HAVE_CUDA
#include "cuda/cuda_copier.h"
#include "cuda/cuda_devices.h"
#endif

namespace commsched {
namespace {

constexpr const char* kBackendVar = "COMMSCHED_BACKEND";

// GPUs this process sees (0 in a build without CUDA): the PS partition rule's message cost depends on where the
// workers compute.
int visible_gpus() {
#ifdef COMMSCHED_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

BackendKind choose_backend(const ClusterEnv& env, const ContextOptions& options, const std::string& env_backend) {
  if (!options.backend.empty()) return parse_backend_kind("backend", options.backend);
  if (!env_backend.empty()) return parse_backend_kind(kBackendVar, env_backend);
  if (env.num_servers > 0) return BackendKind::ps;
  if (env.num_workers == 1) return BackendKind::loopback;
#ifdef COMMSCHED_HAVE_GLOO
  return BackendKind::gloo;  // several workers and no servers (`commsched launch -s 0`): CPU all-reduce
#else
  throw InvalidArgument("COMMSCHED_NUM_WORKERS=" + std::to_string(env.num_workers) +
                        " but COMMSCHED_NUM_SERVERS=0 and this build has no Gloo: start the workers under `commsched "
                        "launch -s 1` (parameter server) or set COMMSCHED_BACKEND=nccl (GPU all-reduce)");
#endif
}

// The backend registry (comm_backends/backend_registry.cc) owns the factories and their errors.
std::shared_ptr<CommBackend> make_backend(BackendKind kind, const ClusterEnv& env, const EngineConfig& config) {
  const BackendInfo* info = find_backend(backend_kind_name(kind));
  if (!info) throw std::logic_error("backend '" + std::string(backend_kind_name(kind)) + "' is not registered");
  return info->make(env, config);
}

bool carries_any(const CommBackend& backend, Device device) {
  for (Op op : {Op::push_pull, Op::allreduce, Op::broadcast})
    if (backend.supports(op, device)) return true;
  return false;
}

// CUDA tensors reach a backend that carries host memory only (the parameter server, Gloo, loopback) through pinned
// staging buffers; host tensors (control messages: the tuner's decision, broadcast_object, metric averages) reach a
// backend that carries device memory only (NCCL) through staging buffers on its device; a backend that takes a
// tensor's memory gets it as it is. Without CUDA nothing is staged, and the engine refuses what the backend cannot
// carry, saying why.
std::vector<std::shared_ptr<Stage>> device_stages([[maybe_unused]] const CommBackend& backend) {
#ifdef COMMSCHED_HAVE_CUDA
  if (!carries_any(backend, Device::cuda)) return {std::make_shared<DeviceCopyStage>(make_cuda_copier())};
  if (!carries_any(backend, Device::cpu)) return {DeviceCopyStage::to_device(make_cuda_copier(), backend.capabilities().cuda_device)};
#endif
  return {};
}

}  // namespace

std::string_view backend_kind_name(BackendKind b) {
  switch (b) {
    case BackendKind::ps: return "ps";
    case BackendKind::gloo: return "gloo";
    case BackendKind::loopback: return "loopback";
    case BackendKind::nccl: return "nccl";
  }
  return "?";
}

BackendKind parse_backend_kind(std::string_view var, std::string_view value) {
  for (BackendKind b : {BackendKind::ps, BackendKind::gloo, BackendKind::loopback, BackendKind::nccl})
    if (value == backend_kind_name(b)) return b;
  throw InvalidArgument(std::string(var) + "='" + std::string(value) + "': expected one of ps, gloo, loopback, nccl");
}

Context::Context(const ContextOptions& options) : Context(options, nullptr) {}

Context::Context(const ContextOptions& options, std::shared_ptr<CommBackend> backend)
    : env_(options.cluster ? *options.cluster : ClusterEnv::from_env()),
      config_(options.engine_config ? *options.engine_config : EngineConfig::from_env()) {
  const bool in_process_group = backend != nullptr;
  const ContextEnvOptions env_options = ContextEnvOptions::from_env();  // read once: a bad value fails here
  env_.validate();
  if (env_.role != Role::worker)
    throw InvalidArgument("COMMSCHED_ROLE=server: this process is a parameter server; run `commsched server` there "
                          "(commsched launch does), not a training script");
  for (const auto& [name, value] : options.engine) config_.set(name, value);
  config_.validate();
  backend_kind_ = backend ? BackendKind::loopback : choose_backend(env_, options, env_options.backend);
  reduce_op_ = backend_kind_ == BackendKind::ps ? Op::push_pull : Op::allreduce;
  if (!backend) {  // a real cluster (not an in-process loopback group): knobs from its shape where none were set
    const int servers = backend_kind_ == BackendKind::ps ? env_.num_servers : 0;  // 0: the all-reduce rule
    // A given COMMSCHED_COLLECTIVE_FUSION_BYTES is the collectives' small-tensor bound: the automatic one keeps it.
    if (servers == 0 && config_.knobs.small_tensor_bytes == 0 && env_value("COMMSCHED_COLLECTIVE_FUSION_BYTES"))
      config_.knobs.small_tensor_bytes = collective::CollectiveOptions::from_env().fusion_bytes;
    link_ = estimate_link();
    // Where the local workers fill the host's cores and compute on them (no GPU), every message's CPU comes out of the
    // training compute (the PS rule only: the all-reduce rule has no per-message cost).
    const PsMessageCost message =
        servers > 0 ? ps_message_cost(env_.local_size, usable_cores(), visible_gpus()) : PsMessageCost{};
    const std::string why = apply_auto_knobs(config_, {env_.num_workers, servers, link_.rate_bps, 0, message});
    if (!why.empty() && env_.rank == 0) std::cerr << "[commsched] " << why << " (" << link_.source << ")\n";
  }
  if (!backend) backend = make_backend(backend_kind_, env_, config_);
  rank_ = backend->rank();
  size_ = backend->size();
  std::vector<std::shared_ptr<Stage>> stages = device_stages(*backend);
  // CUDA tensors then go through pinned host staging (and carry a ready event instead of a synced stream).
  stages_device_copies_ = !stages.empty() && !carries_any(*backend, Device::cuda);
  engine_ = std::make_unique<Engine>(make_policy(config_), std::move(backend), config_, std::move(stages));
  tune_ = options.tune ? *options.tune : env_options.tune;
  // A bad COMMSCHED_TUNER_* value fails here, not at the first step.
  if (tune_) tuner_options_ = options.tuner ? *options.tuner : tuner::TunerOptions::from_env();
  // A loopback group's ranks are threads constructed one after another (an exchange here would wait for a rank not
  // built yet), and its link is the LinkModel it was given.
  if (tune_ && size_ > 1 && !in_process_group) probe_link(env_options.link_probe);
}

// Every rank alike (COMMSCHED_TUNE and COMMSCHED_LINK_PROBE come from the launcher's environment): the exchange is
// collective. A failure keeps the estimate; it costs at most the exchange's time limit.
void Context::probe_link(const std::string& mode) {
  if (mode == "off") {
    link_.source += "; not measured: COMMSCHED_LINK_PROBE=off";
    return;
  }
  ProbeShape shape;
  shape.parameter_server = backend_kind_ == BackendKind::ps;
  shape.workers = size_;
  shape.servers = env_.num_servers;
  shape.partition_bytes = config_.knobs.partition_bytes;
  const auto started = Clock::now();
  try {
    link_ = measured_link(link_, measure_link(shape, engine_exchange(*engine_, reduce_op_)));
    if (rank_ == 0)
      std::cerr << "[commsched] " << link_.source << ", in "
                << std::llround(std::chrono::duration<double>(Clock::now() - started).count() * 1e3) << " ms\n";
  } catch (const std::exception& e) {
    link_.source += std::string("; not measured: ") + e.what();
    if (rank_ == 0) std::cerr << "[commsched] the link could not be measured at startup, the warm start keeps the "
                                 "estimate: " << e.what() << '\n';
  }
}

std::vector<std::unique_ptr<Context>> Context::loopback_group(int ranks, LinkModel link, const ContextOptions& options) {
  if (ranks < 1) throw InvalidArgument("loopback group: ranks=" + std::to_string(ranks) + ", expected at least 1");
  std::vector<std::shared_ptr<CommBackend>> backends = make_loopback_group(ranks, link);
  std::vector<std::unique_ptr<Context>> group;
  for (int r = 0; r < ranks; ++r) {
    ContextOptions o = options;
    o.cluster = ClusterEnv{};
    o.cluster->num_workers = ranks;
    o.cluster->rank = r;
    o.cluster->local_rank = r;
    o.cluster->local_size = ranks;
    group.push_back(std::unique_ptr<Context>(new Context(o, backends[r])));
  }
  return group;
}

void Context::set_model(std::span<const uint64_t> tensor_bytes) {
  model_signature_ = tuner::model_signature(tensor_bytes);
  tensor_bytes_.assign(tensor_bytes.begin(), tensor_bytes.end());
}

Context::~Context() { shutdown(); }

Engine& Context::engine() {
  if (!engine_) throw std::logic_error("commsched: the context was shut down");
  return *engine_;
}

void Context::iteration_end() {
  const Clock::time_point now = Clock::now();
  const double seconds = stats_.steps > 0 ? std::chrono::duration<double>(now - last_step_end_).count() : 0;
  last_step_end_ = now;
  end_step(seconds);
}

void Context::iteration_end_measured(double step_seconds) {
  if (!(step_seconds > 0))
    throw InvalidArgument("Context::iteration_end_measured: step time " + std::to_string(step_seconds) +
                          " s, expected > 0");
  last_step_end_ = Clock::now();
  end_step(step_seconds);
}

void Context::end_step(double step_seconds) {
  ++stats_.steps;
  stats_.last_step_s = step_seconds;
  stats_.total_step_s += step_seconds;
  // The tuner switches knobs through engine_->set_knobs(); they take effect at the next backward_done(), which every
  // worker reaches in the same step. A step without a time (the first clocked one) is skipped on every rank alike.
  if (!tune_ || !engine_) return;
  if (step_seconds <= 0) {
    // The first step has no time (nothing clocked its start), but its backward was timed: with the model's
    // gradients given (set_model, which the plugin calls on every rank alike) the tuner begins here, its warm start
    // planned from that backward, so the warm start's choice runs from the third step instead of the fourth (a
    // switch applies from the next backward_done). The first backward carries one-time costs (gradient buffers
    // allocated, caches cold), which only make its layers look slower than they are (the simulation then gives the
    // links more time to overlap); waiting a step for a second sample would cost a step on the default knobs for
    // every job, while the tuner measures every candidate it tries, so a misranked one costs one trial. Without the
    // model there is nothing to plan and the tuner starts at the first timed step, as before.
    if (!tuner_ && !tensor_bytes_.empty()) {
      start_tuner();
      tuner_->begin();
    }
    return;
  }
  if (!tuner_) start_tuner();
  tuner_->on_step(step_seconds);  // after tuning too: the tuner watches for drift (COMMSCHED_TUNER_DRIFT)
}

void Context::start_tuner() {
  const tuner::TuningKey key{model_signature_, size_, env_.num_servers, std::string(backend_kind_name(backend_kind_))};
  tuner_ = std::make_unique<LiveTuner>(*engine_, key, *tuner_options_);
  std::optional<LiveWarmStart> w = plan_warm_start();
  if (w && !w->trials.empty()) tuner_->warm_start(std::move(w->trials), std::move(w->predicted_s));
}

// Rank 0 only (its proposals are the ones agreed); the other ranks wait for the first agreement meanwhile. None when
// nothing is known of the compute.
std::optional<LiveWarmStart> Context::plan_warm_start() const {
  const std::optional<std::vector<double>>& ready = backward_samples_.best();
  if (rank_ != 0 || size_ < 2 || backend_kind_ == BackendKind::loopback) return std::nullopt;
  if (!compute_profile_ && (!ready || tensor_bytes_.empty())) return std::nullopt;  // nothing known of the compute
  LiveWarmStartJob job;
  job.tensor_bytes = tensor_bytes_;
  if (ready) job.ready_s = *ready;
  job.profile = compute_profile_;
  job.parameter_server = backend_kind_ == BackendKind::ps;
  job.workers = size_;
  job.servers = env_.num_servers;
  job.link = link_;
  job.config = config_;
  job.bounds = tuner_options_->space;
  job.config.knobs = engine_->knobs();
  try {
    LiveWarmStart w = plan_live_warm_start(job);
    std::cerr << "[commsched tuner] " << w.why;
    if (stats_.last_step_s > 0)  // at the first step's end there is no step time yet
      std::cerr << "; measured " << std::llround(stats_.last_step_s * 1e3) << " ms/step now (the first steps include warm-up)";
    std::cerr << '\n';
    return w;
  } catch (const std::exception& e) {
    std::cerr << "[commsched tuner] no warm start: " << e.what() << '\n';
    return std::nullopt;
  }
}

bool Context::tuning_finished() const { return !tune_ || (tuner_ && tuner_->finished()); }

void Context::shutdown() {
  if (!engine_) return;
  tuner_.reset();
  engine_->shutdown();
  engine_.reset();
}

}  // namespace commsched
