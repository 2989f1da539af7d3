#include "comm_backends/ps/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>

namespace commsched::ps {
namespace {
constexpr size_t kMinClass = 4096;
constexpr std::align_val_t kAlign{64};
size_t size_class(size_t bytes) { return std::bit_ceil(bytes < kMinClass ? kMinClass : bytes); }
}  // namespace

BufferPool::~BufferPool() {
  for (auto& [cls, list] : idle_)
    for (std::byte* p : list) ::operator delete[](p, kAlign);
}

std::shared_ptr<std::byte> BufferPool::acquire(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::byte* p = nullptr;
  {
    std::lock_guard lock(mu_);
    auto& list = idle_[cls];
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
    } else {
      allocated_ += cls;
    }
  }
  if (!p) p = static_cast<std::byte*>(::operator new[](cls, kAlign));
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
