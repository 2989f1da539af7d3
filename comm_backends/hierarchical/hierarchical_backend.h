// Hierarchical mode (BytePS's): on each machine the workers reduce-scatter a partition among themselves (the local
// collective: Gloo on CPU, see local_collective.h), each pushes its slice to the parameter server and pulls the sum
// over the machines, then they all-gather the slices. The PS carries 1/local_size of the bytes per worker, and each
// slice key has one contributor per machine (its "lane": the workers with the same local rank), not every worker.
//
//   engine ─► order negotiation (every worker) ─► reduce-scatter (machine) ─► PS push_pull of the slice (lane) ─►
//             all-gather (machine) ─► done
//
// The tensors live where the local collective works: host memory with Gloo, the GPU with NCCL. On the GPU only the
// slice crosses to the host, through a pinned staging buffer from the device-copy stage's pool and copier
// (scheduler/stages), and back; host tensors reach a GPU-local hierarchy through the engine's host-to-device stage,
// CUDA tensors a host-local one through its device-to-host stage, as with any backend.
//
// Every worker runs the same groups in the same order (the collectives' negotiation, over a rendezvous store at
// COMMSCHED_HIERARCHICAL_PORT), so a worker blocked on a slice's sum waits only for workers that reach the same slice
// next. Broadcasts go through the PS as they are (every worker). Chosen by COMMSCHED_HIERARCHICAL with the
// parameter server; with one worker per machine the factory returns the plain PsBackend instead.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/collective/fusion_buffer.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/hierarchical/local_collective.h"
#include "comm_backends/ps/ps_backend.h"
#include "options/option_table.h"
#include "scheduler/stages/device_copier.h"
#include "scheduler/stages/staging_pool.h"

namespace commsched {

// Rows of the option registry (group "hierarchical").
struct HierarchicalOptions {
  std::string local = "off";  // COMMSCHED_HIERARCHICAL: off, or the local collective (gloo, nccl)
  int port = 0;               // COMMSCHED_HIERARCHICAL_PORT: the rendezvous store's port; 0: COMMSCHED_ROOT_PORT + 1
  bool enabled() const { return local != "off"; }
  static HierarchicalOptions from_env();
  static const OptionTable<HierarchicalOptions>& table();
};

// Connects the local collective of `local_rank` of `local_size` through `store` under `prefix` (`env`: addresses
// and timeouts).
using LocalCollectiveFactory = std::function<std::unique_ptr<LocalCollective>(
    const ClusterEnv& env, int local_rank, int local_size, control::Store& store, const std::string& prefix)>;

class HierarchicalBackend final : public collective::CollectiveBackend {
 public:
  // Throws InvalidArgument when the cluster has no hierarchy to use (one worker per machine: use PsBackend), machines
  // of different sizes, or ranks of one machine that are not consecutive; std::runtime_error when connecting fails.
  // `copier` stages the slices of a local collective on device memory (required then, unused otherwise).
  HierarchicalBackend(const ClusterEnv& env, const PsConfig& ps, const HierarchicalOptions& options,
                      collective::CollectiveOptions collective, const LocalCollectiveFactory& make_local,
                      std::shared_ptr<DeviceCopier> copier = nullptr);
  ~HierarchicalBackend() override;

  std::string_view name() const override { return "hierarchical"; }
  // Carries the parameter server's operations (push_pull, broadcast), on the local collective's memory.
  BackendCapabilities capabilities() const override;
  void shutdown() override;
  int machines() const { return machines_; }

 protected:
  void execute(std::span<const PartitionView> group, GroupDone done) override;

 private:
  // Reduce-scatter, the slice through the PS, all-gather, on `bytes` at `data` that the PS knows as `wire` at `offset`.
  void reduce(std::byte* data, const TaskDesc& wire, uint64_t offset, uint64_t bytes);
  Status through_ps(std::vector<PartitionView> batch);
  // A local collective on device memory: the batch through pinned host buffers (copied out, the PS, copied back).
  Status through_ps_staged(const std::vector<PartitionView>& batch);

  ClusterEnv env_;
  ClusterEnv coordination_;  // env_ with the hierarchical rendezvous port
  int machines_ = 1;
  collective::Rendezvous rendezvous_;
  std::unique_ptr<LocalCollective> local_;
  std::unique_ptr<PsBackend> ps_;
  std::unique_ptr<collective::FusionBuffer> fusion_;
  std::shared_ptr<DeviceCopier> copier_;
  std::shared_ptr<StagingPool> staging_;  // pinned host buffers for the slices (device memory only)
  std::once_flag shutdown_once_;
};

// The parameter server for this cluster: HierarchicalBackend when `options` ask for it and machines have more than
// one worker, else the plain PsBackend.
std::shared_ptr<CommBackend> make_parameter_server(const ClusterEnv& env, const PsConfig& ps,
                                                   const HierarchicalOptions& options,
                                                   const collective::CollectiveOptions& collective,
                                                   const LocalCollectiveFactory& make_local,
                                                   std::shared_ptr<DeviceCopier> copier = nullptr);

}  // namespace commsched
