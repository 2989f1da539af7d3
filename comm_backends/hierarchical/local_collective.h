// The collective among the workers of one machine that hierarchical mode runs around the parameter server: a
// reduce-scatter before the push and an all-gather after the pull. Pluggable: Gloo on host memory
// (comm_backends/gloo/gloo_local_collective.h), NCCL on device memory (comm_backends/nccl/nccl_local_collective.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "comm_backends/collective/fusion_buffer.h"
#include "base/types.h"

namespace commsched {

// How a range of `elements` splits into one slice per local rank: as even as whole elements allow, the first
// `elements % local_size` slices one element longer (a range shorter than local_size leaves empty slices).
std::vector<uint64_t> lane_slices(uint64_t elements, int local_size);

class LocalCollective {
 public:
  virtual ~LocalCollective() = default;
  virtual std::string_view name() const = 0;
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // Where `data` lives: host memory, or device device_index() (then the slice is staged to the host for the PS).
  virtual Device memory() const { return Device::cpu; }
  virtual int device_index() const { return 0; }
  // Memory for fusing a group into one buffer, where `data` lives.
  virtual std::unique_ptr<collective::FusionBuffer::Memory> fusion_memory() { return collective::host_fusion_memory(); }
  // `data` holds consecutive slices of `slices[r]` elements of `dtype`, one per local rank r. Afterwards this rank's
  // slice holds the sum of that slice over every local rank; the other slices hold unspecified values.
  virtual void reduce_scatter(std::byte* data, DType dtype, std::span<const uint64_t> slices) = 0;
  // Afterwards every slice holds what its own rank's slice held before, on every local rank.
  virtual void all_gather(std::byte* data, DType dtype, std::span<const uint64_t> slices) = 0;
};

}  // namespace commsched
