#include "comm_backends/collective/fusion_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace commsched::collective {
namespace {

class HostMemory final : public FusionBuffer::Memory {
 public:
  void* allocate(size_t bytes) override {
    void* p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* buffer) override { std::free(buffer); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
};

}  // namespace

std::unique_ptr<FusionBuffer::Memory> host_fusion_memory() { return std::make_unique<HostMemory>(); }

FusionBuffer::FusionBuffer(std::unique_ptr<Memory> memory) : memory_(std::move(memory)) {}

FusionBuffer::~FusionBuffer() {
  if (data_ != nullptr) memory_->release(data_);
}

void FusionBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  if (data_ != nullptr) memory_->release(data_);
  data_ = nullptr;
  capacity_ = 0;
  data_ = memory_->allocate(bytes);
  capacity_ = bytes;
}

void FusionBuffer::run(std::span<const PartitionView> group,
                       const std::function<void(void* data, size_t bytes)>& collective) {
  size_t total = 0;
  for (const auto& p : group) total += p.bytes;
  reserve(total);
  auto* base = static_cast<std::byte*>(data_);
  size_t at = 0;
  for (const auto& p : group) {
    memory_->copy(base + at, p.data(), p.bytes);
    at += p.bytes;
  }
  collective(data_, total);
  at = 0;
  for (const auto& p : group) {
    memory_->copy(p.data(), base + at, p.bytes);
    at += p.bytes;
  }
}

}  // namespace commsched::collective
