// The local collective of hierarchical mode on NCCL: the workers of one machine as one NCCL communicator (one GPU
// each, device local_rank % device count), created from a unique id in hierarchical mode's rendezvous store. The
// reduce-scatter is one ncclReduce per slice to the slice's rank, the all-gather one ncclBroadcast per slice from its
// rank, each set in one NCCL group on the collective's own non-blocking stream: slices of any size, none needing
// padding. The calls return when the stream has finished (its event), so the slice is ready for the PS.
#pragma once

#include <memory>

#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/hierarchical/local_collective.h"

namespace commsched {

class NcclLocalCollective final : public LocalCollective {
 public:
  // Throws std::runtime_error naming the rank and the CUDA/NCCL call that failed (no GPU: cudaGetDeviceCount).
  NcclLocalCollective(const ClusterEnv& env, int local_rank, int local_size, control::Store& store,
                      const std::string& prefix);
  ~NcclLocalCollective() override;
  std::string_view name() const override { return "nccl"; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return size_; }
  Device memory() const override { return Device::cuda; }
  int device_index() const override { return device_; }
  std::unique_ptr<collective::FusionBuffer::Memory> fusion_memory() override;
  void reduce_scatter(std::byte* data, DType dtype, std::span<const uint64_t> slices) override;
  void all_gather(std::byte* data, DType dtype, std::span<const uint64_t> slices) override;

 private:
  struct Impl;  // the communicator, stream and event
  void finish(const char* what);

  int rank_, size_, device_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace commsched
