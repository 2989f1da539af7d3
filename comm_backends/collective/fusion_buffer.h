// The fusion buffer of every collective backend: a fused group (several partitions of one op and dtype, see
// collective_backend.h) is copied one partition after another into one contiguous buffer, the collective runs once on
// it, and the result is copied back. Only the memory differs between backends (host memory for Gloo, device memory and
// stream-ordered copies for NCCL), so that is all a backend provides.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>

#include "scheduler/task.h"

namespace commsched::collective {

class FusionBuffer {
 public:
  // Where the buffer lives and how bytes get in and out of it.
  class Memory {
   public:
    virtual ~Memory() = default;
    virtual void* allocate(size_t bytes) = 0;
    // The buffer is being replaced or destroyed; a device that may still read it must wait first.
    virtual void release(void* buffer) = 0;
    virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  };

  explicit FusionBuffer(std::unique_ptr<Memory> memory);
  ~FusionBuffer();
  FusionBuffer(const FusionBuffer&) = delete;
  FusionBuffer& operator=(const FusionBuffer&) = delete;

  // Gathers the group into the buffer, runs `collective(buffer, total_bytes)` once, scatters the result back.
  // The buffer is kept across calls and grows to the largest group seen (fused groups are bounded by the policy's
  // fusion size, so it stays bounded).
  void run(std::span<const PartitionView> group, const std::function<void(void* data, size_t bytes)>& collective);
  size_t capacity() const { return capacity_; }

 private:
  void reserve(size_t bytes);

  std::unique_ptr<Memory> memory_;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Host memory (malloc and memcpy).
std::unique_ptr<FusionBuffer::Memory> host_fusion_memory();

}  // namespace commsched::collective
