// StagingPool: reusable staging buffers in power-of-two size classes, from a DeviceCopier's pinned host memory (the
// device-to-host direction) or from one device's memory (the host-to-device direction). Both allocations are slow
// (pinning maps and locks pages; cudaMalloc synchronises the device), so a buffer returned to the pool serves the
// next partition of its class: after the first iteration, a steady training loop allocates nothing. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "scheduler/stages/device_copier.h"

namespace commsched {

class StagingPool;

// A leased buffer; returns to its pool when destroyed.
class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(StagingBuffer&& o) noexcept { *this = std::move(o); }
  StagingBuffer& operator=(StagingBuffer&& o) noexcept;
  ~StagingBuffer() { release(); }
  std::byte* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  void release();

 private:
  friend class StagingPool;
  std::shared_ptr<StagingPool> pool_;
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
};

struct StagingStats {
  uint64_t allocations = 0;   // allocations made (one per buffer ever created)
  uint64_t leases = 0;        // acquire() calls
  uint64_t bytes_held = 0;    // bytes owned by the pool (leased or free)
  uint64_t leased = 0;        // buffers leased now
};

// Where a pool's buffers live.
struct StagingMemory {
  enum class Kind { pinned_host, device };
  Kind kind = Kind::pinned_host;
  int device_index = 0;  // Kind::device: the device
  static StagingMemory pinned_host() { return {}; }
  static StagingMemory device(int index) { return {Kind::device, index}; }
};

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  static constexpr size_t kMinClassBytes = 4096;
  static std::shared_ptr<StagingPool> make(std::shared_ptr<DeviceCopier> copier,
                                           StagingMemory memory = StagingMemory::pinned_host());
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A buffer of at least `bytes` (its class: the next power of two, at least kMinClassBytes).
  StagingBuffer acquire(size_t bytes);
  StagingStats stats() const;
  static size_t class_bytes(size_t bytes);

 private:
  StagingPool(std::shared_ptr<DeviceCopier> copier, StagingMemory memory)
      : copier_(std::move(copier)), memory_(memory) {}
  friend class StagingBuffer;
  void give_back(std::byte* p, size_t capacity);
  std::byte* allocate(size_t bytes);
  void free(std::byte* p) noexcept;

  std::shared_ptr<DeviceCopier> copier_;
  StagingMemory memory_;
  mutable std::mutex mu_;
  std::vector<std::vector<std::byte*>> free_;  // by class: free_[k] holds buffers of kMinClassBytes << k
  StagingStats stats_;
};

}  // namespace commsched
