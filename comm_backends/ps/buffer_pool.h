// Pool of aligned byte buffers in power-of-two size classes, so the server's per-round accumulators and sums reuse
// memory instead of growing: after the first rounds, allocated_bytes() stays flat. Thread-safe (buffers are released
// from the transport's threads once a zero-copy send is done). Buffers from 64 KiB up are cut from 2 MiB-aligned
// regions advised to be transparent huge pages (buffer_pool.cc says why); smaller ones are 64-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "comm_backends/ps/transport.h"

namespace commsched::ps {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> create() { return std::shared_ptr<BufferPool>(new BufferPool()); }
  ~BufferPool();
  // A buffer of at least `bytes` bytes (64-byte aligned); returns to the pool when the last copy dies.
  std::shared_ptr<std::byte> acquire(size_t bytes);
  // Bytes the pool has obtained from the system (in use + idle).
  uint64_t allocated_bytes() const;
  uint64_t idle_buffers() const;

 private:
  BufferPool() = default;
  std::byte* take_idle(size_t cls);
  std::byte* grow(size_t cls);
  void give_back(std::byte* p, size_t cls);
  mutable std::mutex mu_;
  std::map<size_t, std::vector<std::byte*>> idle_;  // size class -> idle buffers
  std::vector<std::pair<std::byte*, size_t>> regions_;  // huge-page mappings the big classes are cut from
  uint64_t allocated_ = 0;
};

// A received message's bytes in a pooled buffer: the buffer goes back to the pool when the last reference does.
// Used by the transports that receive into pool buffers and by the server when it must copy a payload.
class PooledPayload final : public Payload {
 public:
  PooledPayload(std::shared_ptr<std::byte> buf, size_t size) : buf_(std::move(buf)), size_(size) {}
  std::span<const std::byte> bytes() const override { return {buf_.get(), size_}; }

 private:
  std::shared_ptr<std::byte> buf_;
  size_t size_;
};

// A range of another payload (one entry of a push_pull_batch), which it keeps alive.
class SlicePayload final : public Payload {
 public:
  SlicePayload(std::shared_ptr<const Payload> whole, std::span<const std::byte> part)
      : whole_(std::move(whole)), part_(part) {}
  std::span<const std::byte> bytes() const override { return part_; }

 private:
  std::shared_ptr<const Payload> whole_;
  std::span<const std::byte> part_;
};

// The kernels read elements through typed pointers, so a push must start at a multiple of its element size. ZeroMQ
// hands small messages out of its shared receive buffer at any offset: those (and only those) are copied first.
std::shared_ptr<Payload> element_aligned(std::shared_ptr<Payload> p, size_t element_size, BufferPool& pool);

}  // namespace commsched::ps
