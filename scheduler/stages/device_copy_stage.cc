#include "scheduler/stages/device_copy_stage.h"

#include <stdexcept>
#include <string>

namespace commsched {
namespace {

// The partition's staging buffer and the TaskDesc that describes it to the backend: a buffer of the other side.
struct StagedCopy final : StageState {
  TaskDesc desc;
  StagingBuffer staging;
};

std::string copy_failure(const char* direction, const PartitionView& v, int device, const std::exception& ex) {
  return std::string(direction) + " of " + std::to_string(v.bytes) + " bytes at offset " + std::to_string(v.offset) +
         " of cuda:" + std::to_string(device) + " failed: " + ex.what();
}

}  // namespace

DeviceCopyStage::DeviceCopyStage(std::shared_ptr<DeviceCopier> copier, size_t concurrency)
    : DeviceCopyStage(std::move(copier), concurrency, Direction::to_host, 0) {}

DeviceCopyStage::DeviceCopyStage(std::shared_ptr<DeviceCopier> copier, size_t concurrency, Direction direction,
                                 int device_index)
    : copier_(std::move(copier)), concurrency_(concurrency), direction_(direction), device_index_(device_index) {
  if (!copier_) throw std::invalid_argument("DeviceCopyStage: copier must not be null");
  pool_ = StagingPool::make(copier_, direction == Direction::to_host ? StagingMemory::pinned_host()
                                                                     : StagingMemory::device(device_index));
}

std::shared_ptr<DeviceCopyStage> DeviceCopyStage::to_device(std::shared_ptr<DeviceCopier> copier, int device_index,
                                                            size_t concurrency) {
  if (device_index < 0) throw std::invalid_argument("DeviceCopyStage: device index must not be negative");
  return std::shared_ptr<DeviceCopyStage>(
      new DeviceCopyStage(std::move(copier), concurrency, Direction::to_device, device_index));
}

// Into the staging buffer, then wait for the copy's completion (an event on CUDA).
void DeviceCopyStage::copy_in(std::byte* staging, const PartitionView& in) {
  const TaskDesc& t = *in.task;
  const int device = device_of(t);
  try {
    if (direction_ == Direction::to_host)
      copier_->to_host(staging, in.data(), in.bytes, device, t.buffer.ready_event)->wait();
    else
      copier_->to_device(staging, in.data(), in.bytes, device)->wait();  // a host tensor is ready when submitted
  } catch (const std::exception& ex) {
    throw std::runtime_error(copy_failure(direction_ == Direction::to_host ? "device-to-host copy" : "host-to-device copy",
                                          in, device, ex));
  }
}

void DeviceCopyStage::copy_out(const PartitionView& target, const std::byte* staging) {
  const int device = device_of(*target.task);
  try {
    if (direction_ == Direction::to_host)
      copier_->to_device(target.data(), staging, target.bytes, device)->wait();
    else
      copier_->to_host(target.data(), staging, target.bytes, device, nullptr)->wait();
  } catch (const std::exception& ex) {
    throw std::runtime_error(copy_failure(direction_ == Direction::to_host ? "host-to-device copy" : "device-to-host copy",
                                          target, device, ex));
  }
}

void DeviceCopyStage::encode(const PartitionView& in, PartitionView& out, std::unique_ptr<StageState>& state) {
  auto s = std::make_unique<StagedCopy>();
  s->desc = *in.task;
  // The backend reads the staging buffer (out.payload), never the task's own pointer.
  s->desc.buffer = direction_ == Direction::to_host ? Buffer{} : Buffer{nullptr, Device::cuda, device_index_, nullptr};
  s->staging = pool_->acquire(in.bytes);
  copy_in(s->staging.data(), in);
  out = in;
  out.task = &s->desc;
  out.payload = s->staging.data();
  state = std::move(s);
}

void DeviceCopyStage::decode(const PartitionView& wire, const PartitionView& target, std::unique_ptr<StageState>&) {
  copy_out(target, wire.data());
}

}  // namespace commsched
