#include "scheduler/stages/device_copy_stage.h"

#include <stdexcept>
#include <string>

namespace commsched {
namespace {

// The partition's staging buffer and the TaskDesc that describes it to the backend: a host buffer.
struct HostCopy final : StageState {
  TaskDesc desc;
  StagingBuffer staging;
};

std::string copy_failure(const char* direction, const PartitionView& v, const std::exception& ex) {
  return std::string(direction) + " of " + std::to_string(v.bytes) + " bytes at offset " + std::to_string(v.offset) +
         " of cuda:" + std::to_string(v.task->buffer.device_index) + " failed: " + ex.what();
}

}  // namespace

DeviceCopyStage::DeviceCopyStage(std::shared_ptr<DeviceCopier> copier, size_t concurrency)
    : copier_(std::move(copier)), concurrency_(concurrency) {
  if (!copier_) throw std::invalid_argument("DeviceCopyStage: copier must not be null");
  pool_ = StagingPool::make(copier_);
}

void DeviceCopyStage::encode(const PartitionView& in, PartitionView& out, std::unique_ptr<StageState>& state) {
  const TaskDesc& t = *in.task;
  auto s = std::make_unique<HostCopy>();
  s->desc = t;
  s->desc.buffer = Buffer{};  // the backend reads the staging buffer (out.payload), never the device pointer
  s->staging = pool_->acquire(in.bytes);
  try {
    copier_->to_host(s->staging.data(), in.data(), in.bytes, t.buffer.device_index, t.buffer.ready_event)->wait();
  } catch (const std::exception& ex) {
    throw std::runtime_error(copy_failure("device-to-host copy", in, ex));
  }
  out = in;
  out.task = &s->desc;
  out.payload = s->staging.data();
  state = std::move(s);
}

void DeviceCopyStage::decode(const PartitionView& wire, const PartitionView& target, std::unique_ptr<StageState>&) {
  try {
    copier_->to_device(target.data(), wire.data(), target.bytes, target.task->buffer.device_index)->wait();
  } catch (const std::exception& ex) {
    throw std::runtime_error(copy_failure("host-to-device copy", target, ex));
  }
}

}  // namespace commsched
