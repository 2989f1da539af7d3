#include "scheduler/stages/staging_pool.h"

#include <bit>

namespace commsched {
namespace {
size_t class_index(size_t class_bytes) {
  return static_cast<size_t>(std::countr_zero(class_bytes) - std::countr_zero(StagingPool::kMinClassBytes));
}
}  // namespace

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

void StagingBuffer::release() {
  if (data_) pool_->give_back(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
  pool_.reset();
}

std::shared_ptr<StagingPool> StagingPool::make(std::shared_ptr<DeviceCopier> copier, StagingMemory memory) {
  return std::shared_ptr<StagingPool>(new StagingPool(std::move(copier), memory));
}

std::byte* StagingPool::allocate(size_t bytes) {
  if (memory_.kind == StagingMemory::Kind::device) return copier_->alloc_device(bytes, memory_.device_index);
  return copier_->alloc_host(bytes);
}

void StagingPool::free(std::byte* p) noexcept {
  if (memory_.kind == StagingMemory::Kind::device) copier_->free_device(p, memory_.device_index);
  else copier_->free_host(p);
}

StagingPool::~StagingPool() {
  // Leased buffers hold the pool alive, so every buffer is free here.
  for (auto& list : free_)
    for (std::byte* p : list) free(p);
}

size_t StagingPool::class_bytes(size_t bytes) { return std::bit_ceil(std::max(bytes, kMinClassBytes)); }

StagingBuffer StagingPool::acquire(size_t bytes) {
  const size_t cap = class_bytes(bytes);
  const size_t k = class_index(cap);
  StagingBuffer b;
  b.capacity_ = cap;
  {
    std::lock_guard lk(mu_);
    ++stats_.leases;
    if (k < free_.size() && !free_[k].empty()) {
      b.data_ = free_[k].back();
      free_[k].pop_back();
      ++stats_.leased;
    }
  }
  if (!b.data_) {
    std::byte* p = allocate(cap);  // outside the lock: pinning pages (or cudaMalloc) takes milliseconds
    std::lock_guard lk(mu_);
    b.data_ = p;
    ++stats_.allocations;
    ++stats_.leased;
    stats_.bytes_held += cap;
  }
  b.pool_ = shared_from_this();
  return b;
}

void StagingPool::give_back(std::byte* p, size_t capacity) {
  const size_t k = class_index(capacity);
  std::lock_guard lk(mu_);
  if (free_.size() <= k) free_.resize(k + 1);
  free_[k].push_back(p);
  --stats_.leased;
}

StagingStats StagingPool::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace commsched
