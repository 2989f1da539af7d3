// StagingPool: reusable host staging buffers in power-of-two size classes, from a DeviceCopier's pinned memory.
// Pinned allocation is slow (it maps and locks pages), so a buffer returned to the pool serves the next partition of
// its class: after the first iteration, a steady training loop allocates nothing. Thread-safe.
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
  uint64_t allocations = 0;   // pinned allocations made (one per buffer ever created)
  uint64_t leases = 0;        // acquire() calls
  uint64_t bytes_held = 0;    // pinned bytes owned by the pool (leased or free)
  uint64_t leased = 0;        // buffers leased now
};

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  static constexpr size_t kMinClassBytes = 4096;
  static std::shared_ptr<StagingPool> make(std::shared_ptr<DeviceCopier> copier);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A buffer of at least `bytes` (its class: the next power of two, at least kMinClassBytes).
  StagingBuffer acquire(size_t bytes);
  StagingStats stats() const;
  static size_t class_bytes(size_t bytes);

 private:
  explicit StagingPool(std::shared_ptr<DeviceCopier> copier) : copier_(std::move(copier)) {}
  friend class StagingBuffer;
  void give_back(std::byte* p, size_t capacity);

  std::shared_ptr<DeviceCopier> copier_;
  mutable std::mutex mu_;
  std::vector<std::vector<std::byte*>> free_;  // by class: free_[k] holds buffers of kMinClassBytes << k
  StagingStats stats_;
};

}  // namespace commsched
