#include "comm_backends/ps/buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <new>

namespace commsched::ps {
namespace {
constexpr size_t kMinClass = 4096;
constexpr std::align_val_t kAlign{64};
size_t size_class(size_t bytes) { return std::bit_ceil(bytes < kMinClass ? kMinClass : bytes); }

// Buffers from kHugeFrom up sit on transparent huge pages. UCX over shared memory moves a rendezvous payload (from
// 64 KiB) with one CMA copy (process_vm_readv/writev) that first pins every page of the other process's buffer, a
// page-table walk per page: a quarter of the PS's CPU time at 4 MiB (perf, session 22). From a huge-page buffer the
// same copy ran 1.6-1.9x faster here (4 MiB: 3.9-5.6 -> 7.4-8.8 GB/s), and a worker's pull reads from the server's
// pool. Buffers under a huge page are cut from one (its size is a multiple of theirs). THP is often "madvise" only
// (Debian's default), hence the advice; where THP is off it changes nothing.
constexpr size_t kHugePage = 2 << 20;
constexpr size_t kHugeFrom = 64 << 10;

// `len` bytes (a multiple of kHugePage) aligned to a huge page, so that every 2 MiB of it can be one.
std::byte* map_huge(size_t len) {
  void* raw = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw), end = start + len + kHugePage;
  const uintptr_t at = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (at > start) ::munmap(raw, at - start);
  if (end > at + len) ::munmap(reinterpret_cast<void*>(at + len), end - at - len);
  ::madvise(reinterpret_cast<void*>(at), len, MADV_HUGEPAGE);
  return reinterpret_cast<std::byte*>(at);
}
}  // namespace

BufferPool::~BufferPool() {
  for (auto& [cls, list] : idle_)
    if (cls < kHugeFrom)
      for (std::byte* p : list) ::operator delete[](p, kAlign);
  for (auto [p, len] : regions_) ::munmap(p, len);
}

std::byte* BufferPool::take_idle(size_t cls) {
  std::lock_guard lock(mu_);
  auto& list = idle_[cls];
  if (list.empty()) return nullptr;
  std::byte* p = list.back();
  list.pop_back();
  return p;
}

// A new huge-page region: the first buffer of it is returned, the rest of it (buffers of the same class) go idle.
std::byte* BufferPool::grow(size_t cls) {
  if (cls < kHugeFrom) {
    std::byte* p = static_cast<std::byte*>(::operator new[](cls, kAlign));
    std::lock_guard lock(mu_);
    allocated_ += cls;
    return p;
  }
  const size_t len = std::max(cls, kHugePage);
  std::byte* region = map_huge(len);
  std::lock_guard lock(mu_);
  regions_.emplace_back(region, len);
  allocated_ += len;
  for (size_t at = cls; at < len; at += cls) idle_[cls].push_back(region + at);
  return region;
}

std::shared_ptr<std::byte> BufferPool::acquire(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::byte* p = take_idle(cls);
  if (!p) p = grow(cls);
  // The deleter keeps the pool alive until the buffer is back.
  return std::shared_ptr<std::byte>(p, [self = shared_from_this(), cls](std::byte* q) { self->give_back(q, cls); });
}

void BufferPool::give_back(std::byte* p, size_t cls) {
  std::lock_guard lock(mu_);
  idle_[cls].push_back(p);
}

uint64_t BufferPool::allocated_bytes() const {
  std::lock_guard lock(mu_);
  return allocated_;
}

uint64_t BufferPool::idle_buffers() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (auto& [cls, list] : idle_) n += list.size();
  return n;
}

std::shared_ptr<Payload> element_aligned(std::shared_ptr<Payload> p, size_t element_size, BufferPool& pool) {
  if (!p || reinterpret_cast<uintptr_t>(p->bytes().data()) % element_size == 0) return p;
  const auto src = p->bytes();
  auto copy = pool.acquire(std::max<size_t>(src.size(), 1));
  std::memcpy(copy.get(), src.data(), src.size());
  return std::make_shared<PooledPayload>(std::move(copy), src.size());
}

}  // namespace commsched::ps
