// Every backend's row and factory; the one file that includes every backend.
#include "comm_backends/backend_registry.h"


#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/hierarchical/hierarchical_backend.h"
#include "comm_backends/loopback/loopback_backend.h"
#include "comm_backends/ps/ps_backend.h"
#include "comm_backends/ps/ps_config.h"
#include "scheduler/config.h"
#ifdef COMMSCHED_HAVE_GLOO
#include "comm_backends/gloo/gloo_backend.h"
#include "comm_backends/gloo/gloo_local_collective.h"
#endif
#ifdef COMMSCHED_HAVE_CUDA
#include "comm_backends/nccl/nccl_backend.h"
#include "comm_backends/nccl/nccl_local_collective.h"
#include "cuda/cuda_copier.h"
#endif

namespace commsched {
namespace {

constexpr bool kHaveGloo =
#ifdef COMMSCHED_HAVE_GLOO
    true;
#else
    false;
#endif
constexpr bool kHaveNccl =
#ifdef COMMSCHED_HAVE_CUDA
    true;
#else
    false;
#endif

// The collective backends: rank 0's coordinator runs the policy the engines run (not the environment's, which an
// explicit config, e.g. Python's init(policy=...), may override).
collective::CollectiveOptions collective_options(const EngineConfig& engine) {
  auto o = collective::CollectiveOptions::from_env();
  o.policy = engine;
  return o;
}

// Hierarchical mode's local collective among the workers of one machine (COMMSCHED_HIERARCHICAL=gloo).
LocalCollectiveFactory local_collective([[maybe_unused]] const HierarchicalOptions& o) {
#ifdef COMMSCHED_HAVE_GLOO
  if (o.local == "gloo")
    return [](const ClusterEnv& env, int rank, int size, control::Store& store, const std::string& prefix) {
      return std::make_unique<GlooLocalCollective>(connect_gloo_mesh(env, rank, size, store, prefix), rank, size);
    };
#endif
#ifdef COMMSCHED_HAVE_CUDA
  if (o.local == "nccl")
    return [](const ClusterEnv& env, int rank, int size, control::Store& store, const std::string& prefix) {
      return std::make_unique<NcclLocalCollective>(env, rank, size, store, prefix);
    };
#endif
  return nullptr;
}

// A local collective on GPUs stages its slices through pinned host memory with the device-copy stage's copier.
std::shared_ptr<DeviceCopier> slice_copier([[maybe_unused]] const HierarchicalOptions& o) {
#ifdef COMMSCHED_HAVE_CUDA
  if (o.local == "nccl") return make_cuda_copier();
#endif
  return nullptr;
}

std::shared_ptr<CommBackend> make_ps(const ClusterEnv& env, const EngineConfig& engine) {
  if (env.num_servers < 1)
    throw InvalidArgument("COMMSCHED_BACKEND=ps needs servers, but COMMSCHED_NUM_SERVERS=0 (use `commsched launch`)");
  const HierarchicalOptions h = HierarchicalOptions::from_env();
  return make_parameter_server(env, PsConfig::from_env(), h, collective_options(engine), local_collective(h),
                               slice_copier(h));
}

std::shared_ptr<CommBackend> make_loopback(const ClusterEnv& env, const EngineConfig&) {
  if (env.num_workers != 1)
    throw InvalidArgument("COMMSCHED_BACKEND=loopback runs one process only, but COMMSCHED_NUM_WORKERS=" +
                          std::to_string(env.num_workers));
  return make_loopback_group(1).front();
}


std::shared_ptr<CommBackend> make_gloo([[maybe_unused]] const ClusterEnv& env, [[maybe_unused]] const EngineConfig& engine) {
#ifdef COMMSCHED_HAVE_GLOO
  return std::make_shared<GlooBackend>(env, collective_options(engine));
#else
  throw InvalidArgument("COMMSCHED_BACKEND=gloo, but this build has no Gloo (install libgloo-dev and rebuild)");
#endif
}

std::shared_ptr<CommBackend> make_nccl([[maybe_unused]] const ClusterEnv& env, [[maybe_unused]] const EngineConfig& engine) {
#ifdef COMMSCHED_HAVE_CUDA
  return std::make_shared<NcclBackend>(env, collective_options(engine));
#else
  throw InvalidArgument("COMMSCHED_BACKEND=nccl, but this build has no CUDA/NCCL");
#endif
}

// The registrations, in the order COMMSCHED_BACKEND lists them.
const std::vector<BackendInfo>& registrations() {
  static const std::vector<BackendInfo> rows = {
      {"ps", "parameter server over ZeroMQ (or UCX): workers push, servers sum, workers pull", true, "",
       {Op::push_pull, Op::broadcast}, {Device::cpu}, make_ps},
      {"gloo", "CPU all-reduce on Gloo, the order negotiated on rank 0", kHaveGloo,
       "install libgloo-dev and rebuild", {Op::allreduce, Op::broadcast}, {Device::cpu}, make_gloo},
      {"loopback", "one process: every operation completes locally (tests, single-worker runs)", true, "",
       {Op::push_pull, Op::allreduce, Op::broadcast}, {Device::cpu}, make_loopback},
      {"nccl", "GPU all-reduce on NCCL, the order negotiated on rank 0", kHaveNccl,
       "install the CUDA toolkit and NCCL and rebuild", {Op::allreduce, Op::broadcast}, {Device::cuda}, make_nccl},
  };
  return rows;
}

}  // namespace

std::span<const BackendInfo> backend_registry() { return registrations(); }

const BackendInfo* find_backend(std::string_view name) {
  for (const BackendInfo& b : registrations())
    if (b.name == name) return &b;
  return nullptr;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const BackendInfo& b : registrations()) out.emplace_back(b.name);
  return out;
}

}  // namespace commsched
