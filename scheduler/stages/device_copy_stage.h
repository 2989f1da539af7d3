// The device-copy stage: lets a backend that carries host memory only (the parameter server, Gloo) carry CUDA
// tensors. Encode copies a partition from the device into a pinned staging buffer on the copier's own stream and
// waits for that copy's event (the producer's stream is never synced: the copy waits for the producer's ready event
// on the device); the backend then sees a host buffer. Decode copies the result back and waits for it, so the task
// completes only when the device holds the result. Partitions of one tensor copy in parallel (the stage's
// concurrency), so one partition's copies overlap the network time of others (BytePS's pipeline). Staging buffers
// come from a pool and are reused across iterations. CPU tensors pass untouched (zero-copy).
#pragma once

#include <memory>

#include "scheduler/stage.h"
#include "scheduler/stages/device_copier.h"
#include "scheduler/stages/staging_pool.h"

namespace commsched {

class DeviceCopyStage final : public Stage {
 public:
  // Enough partitions in flight to keep both copy directions and the wire busy, few enough to bound pinned memory.
  static constexpr size_t kDefaultConcurrency = 4;
  explicit DeviceCopyStage(std::shared_ptr<DeviceCopier> copier, size_t concurrency = kDefaultConcurrency);

  std::string_view name() const override { return "device_copy"; }
  size_t concurrency() const override { return concurrency_; }
  bool applies(const TaskDesc& task) const override { return task.buffer.device == Device::cuda; }
  Placement placement() const override { return Placement::memory; }
  std::optional<Device> output_device(const TaskDesc&) const override { return Device::cpu; }
  void encode(const PartitionView& in, PartitionView& out, std::unique_ptr<StageState>& state) override;
  void decode(const PartitionView& wire, const PartitionView& target, std::unique_ptr<StageState>& state) override;

  StagingStats staging() const { return pool_->stats(); }
  std::string_view copier_name() const { return copier_->name(); }

 private:
  std::shared_ptr<DeviceCopier> copier_;
  std::shared_ptr<StagingPool> pool_;
  size_t concurrency_;
};

}  // namespace commsched
