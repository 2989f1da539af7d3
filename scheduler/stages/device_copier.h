// DeviceCopier: the device operations the device-copy stage needs (pinned host memory, device memory, asynchronous
// copies between a device and the host, their completions), behind one small interface. Two implementations: CUDA (cuda/cuda_copier.h,
// built with CUDA) and a host stand-in (host_copier.h) that runs the same staging logic on CPU memory, so the stage's
// pooling, ordering and error paths are tested on machines without a GPU.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

namespace commsched {

// One copy in flight. wait() blocks the calling thread until the copy has finished (never syncs a whole stream or
// device) and throws std::runtime_error, naming the failed call, when it failed. Destroying an unwaited completion
// is allowed; the copier finishes the copy on its own.
class CopyCompletion {
 public:
  virtual ~CopyCompletion() = default;
  virtual void wait() = 0;
};

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  virtual std::string_view name() const = 0;
  // Page-locked host memory (asynchronous copies need it); throws std::runtime_error naming the call and the size.
  virtual std::byte* alloc_host(size_t bytes) = 0;
  virtual void free_host(std::byte* p) noexcept = 0;
  // Memory on device `device_index`: the staging buffers through which a backend that carries device memory only
  // (NCCL) carries host tensors. Throws std::runtime_error naming the call, the size and the device.
  virtual std::byte* alloc_device(size_t bytes, int device_index) = 0;
  virtual void free_device(std::byte* p, int device_index) noexcept = 0;
  // Device → host on the copier's own stream for `device_index`. The copy starts after `ready` (the producer's event,
  // Buffer::ready_event; null: at once). Throws when the copy cannot be started.
  virtual std::unique_ptr<CopyCompletion> to_host(std::byte* host, const std::byte* device, size_t bytes,
                                                  int device_index, void* ready) = 0;
  // Host → device on the copier's own stream for `device_index`. `host` may be pageable (a host tensor staged for a
  // device-only backend): the copy is then correct, only not asynchronous to the host.
  virtual std::unique_ptr<CopyCompletion> to_device(std::byte* device, const std::byte* host, size_t bytes,
                                                    int device_index) = 0;
};

}  // namespace commsched
