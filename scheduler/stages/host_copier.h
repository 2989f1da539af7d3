// HostCopier: the DeviceCopier stand-in on host memory. "Device" pointers are host pointers; each direction has a
// worker thread that runs its copies in order (as a CUDA stream does), and completions are futures. A copy to the
// host first waits for its `ready` event, which here is a `const HostReadyEvent*` (a future the producer fulfils),
// as a CUDA copy stream waits for the producer's event. Counts allocations and can fail chosen copies, so the
// device-copy stage's pooling, ordering and error paths are tested without a GPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "scheduler/stages/device_copier.h"

namespace commsched {

using HostReadyEvent = std::shared_future<void>;

class HostCopier final : public DeviceCopier {
 public:
  HostCopier();
  ~HostCopier() override;
  std::string_view name() const override { return "host"; }
  std::byte* alloc_host(size_t bytes) override;
  void free_host(std::byte* p) noexcept override;
  // "Device" memory is host memory too, counted apart so tests see which side the pool allocates on.
  std::byte* alloc_device(size_t bytes, int device_index) override;
  void free_device(std::byte* p, int device_index) noexcept override;
  std::unique_ptr<CopyCompletion> to_host(std::byte* host, const std::byte* device, size_t bytes, int device_index,
                                          void* ready) override;
  std::unique_ptr<CopyCompletion> to_device(std::byte* device, const std::byte* host, size_t bytes,
                                            int device_index) override;

  // The copy started `after` more copies from now (0: the next) fails with `message`, in either direction.
  void fail_copy(uint64_t after, std::string message);
  uint64_t allocations() const { return allocations_.load(); }
  uint64_t frees() const { return frees_.load(); }
  uint64_t copies() const { return copies_.load(); }
  uint64_t device_allocations() const { return device_allocations_.load(); }
  uint64_t device_frees() const { return device_frees_.load(); }

 private:
  // One in-order queue with its thread: a stream.
  class Lane {
   public:
    Lane();
    ~Lane();
    std::future<void> push(std::function<void()> job);

   private:
    void run();
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::packaged_task<void()>> jobs_;
    bool stop_ = false;
    std::thread thread_;
  };
  std::unique_ptr<CopyCompletion> enqueue(Lane& lane, std::function<void()> copy);

  Lane d2h_, h2d_;
  std::atomic<uint64_t> allocations_{0}, frees_{0}, copies_{0}, device_allocations_{0}, device_frees_{0};
  std::mutex fail_mu_;
  int64_t fail_at_ = -1;  // copies_ value whose copy fails; -1: none
  std::string fail_message_;
};

}  // namespace commsched
