// The device-copy stage, in one of two directions.
//
// Device to host (the default): lets a backend that carries host memory only (the parameter server, Gloo) carry CUDA
// tensors. Encode copies a partition from the device into a pinned staging buffer on the copier's own stream and
// waits for that copy's event (the producer's stream is never synced: the copy waits for the producer's ready event
// on the device); the backend then sees a host buffer. Decode copies the result back and waits for it, so the task
// completes only when the device holds the result. Partitions of one tensor copy in parallel (the stage's
// concurrency), so one partition's copies overlap the network time of others (BytePS's pipeline). Staging buffers
// come from a pool and are reused across iterations. CPU tensors pass untouched (zero-copy).
//
// Host to device (the reverse): lets a backend that carries device memory only (NCCL) carry host tensors, the
// control messages every backend must carry (the tuner's decision, broadcast_object, metric averages). Encode copies
// the partition into a staging buffer on the backend's device, the backend runs its collective there, decode copies
// the result back to the host tensor; completions are the copier's events, as above. CUDA tensors pass untouched.
// It runs after the compression stage (Placement::transform), so a host tensor is compressed on the host before it
// moves, as the codecs need.
#pragma once

#include <memory>

#include "scheduler/stage.h"
#include "scheduler/stages/device_copier.h"
#include "scheduler/stages/staging_pool.h"

namespace commsched {

class DeviceCopyStage final : public Stage {
 public:
  enum class Direction { to_host, to_device };
  // Enough partitions in flight to keep both copy directions and the wire busy, few enough to bound pinned memory.
  static constexpr size_t kDefaultConcurrency = 4;
  // Device to host.
  explicit DeviceCopyStage(std::shared_ptr<DeviceCopier> copier, size_t concurrency = kDefaultConcurrency);
  // Host to device `device_index` (the backend's device).
  static std::shared_ptr<DeviceCopyStage> to_device(std::shared_ptr<DeviceCopier> copier, int device_index,
                                                    size_t concurrency = kDefaultConcurrency);

  std::string_view name() const override { return direction_ == Direction::to_host ? "device_copy" : "host_to_device"; }
  size_t concurrency() const override { return concurrency_; }
  bool applies(const TaskDesc& task) const override { return task.buffer.device == source(); }
  Placement placement() const override {
    return direction_ == Direction::to_host ? Placement::memory : Placement::transform;
  }
  std::optional<Device> output_device(const TaskDesc&) const override {
    return direction_ == Direction::to_host ? Device::cpu : Device::cuda;
  }
  void encode(const PartitionView& in, PartitionView& out, std::unique_ptr<StageState>& state) override;
  void decode(const PartitionView& wire, const PartitionView& target, std::unique_ptr<StageState>& state) override;

  Direction direction() const { return direction_; }
  StagingStats staging() const { return pool_->stats(); }
  std::string_view copier_name() const { return copier_->name(); }

 private:
  DeviceCopyStage(std::shared_ptr<DeviceCopier> copier, size_t concurrency, Direction direction, int device_index);
  Device source() const { return direction_ == Direction::to_host ? Device::cuda : Device::cpu; }
  // The device whose memory a partition of `task` is copied to or from.
  int device_of(const TaskDesc& task) const {
    return direction_ == Direction::to_host ? task.buffer.device_index : device_index_;
  }
  void copy_in(std::byte* staging, const PartitionView& in);
  void copy_out(const PartitionView& target, const std::byte* staging);

  std::shared_ptr<DeviceCopier> copier_;
  std::shared_ptr<StagingPool> pool_;
  size_t concurrency_;
  Direction direction_;
  int device_index_;  // to_device: where the staging buffers live
};

}  // namespace commsched
