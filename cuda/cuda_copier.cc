#include "cuda/cuda_copier.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace commsched {
namespace {

void check(cudaError_t e, const char* call, const std::string& args) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // a non-sticky error would otherwise be reported again by the next unrelated call
  throw std::runtime_error(std::string(call) + "(" + args + "): " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                           ")");
}

std::string dev(int d) { return "cuda:" + std::to_string(d); }

class CudaCopier;

class EventCompletion final : public CopyCompletion {
 public:
  EventCompletion(CudaCopier* owner, int device, cudaEvent_t ev) : owner_(owner), device_(device), ev_(ev) {}
  ~EventCompletion() override;
  void wait() override {
    check(cudaEventSynchronize(ev_), "cudaEventSynchronize", "copy event on " + dev(device_));
  }

 private:
  CudaCopier* owner_;
  int device_;
  cudaEvent_t ev_;
};

class CudaCopier final : public DeviceCopier {
 public:
  std::string_view name() const override { return "cuda"; }

  ~CudaCopier() override {
    // At process exit the driver may be gone already: errors here are ignored.
    for (auto& [d, s] : devices_) {
      cudaSetDevice(d);
      cudaStreamSynchronize(s.d2h);
      cudaStreamSynchronize(s.h2d);
      for (cudaEvent_t e : s.events) cudaEventDestroy(e);
      cudaStreamDestroy(s.d2h);
      cudaStreamDestroy(s.h2d);
    }
  }

  std::byte* alloc_host(size_t bytes) override {
    void* p = nullptr;
    // Portable: the staging buffer may serve tensors of any device of this process.
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc", std::to_string(bytes) + " bytes");
    return static_cast<std::byte*>(p);
  }

  void free_host(std::byte* p) noexcept override { cudaFreeHost(p); }

  std::byte* alloc_device(size_t bytes, int device_index) override {
    check(cudaSetDevice(device_index), "cudaSetDevice", dev(device_index));
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc", std::to_string(bytes) + " bytes on " + dev(device_index));
    return static_cast<std::byte*>(p);
  }

  void free_device(std::byte* p, int device_index) noexcept override {
    cudaSetDevice(device_index);
    cudaFree(p);  // a pool frees only buffers no copy uses any more (every copy was waited for)
  }

  std::unique_ptr<CopyCompletion> to_host(std::byte* host, const std::byte* device, size_t bytes, int device_index,
                                          void* ready) override {
    Streams& s = streams(device_index);
    if (ready)
      check(cudaStreamWaitEvent(s.d2h, static_cast<cudaEvent_t>(ready), 0), "cudaStreamWaitEvent",
            "producer's ready event, " + dev(device_index));
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s.d2h), "cudaMemcpyAsync",
          "device to host, " + std::to_string(bytes) + " bytes from " + dev(device_index));
    return record(device_index, s, s.d2h);
  }

  std::unique_ptr<CopyCompletion> to_device(std::byte* device, const std::byte* host, size_t bytes,
                                            int device_index) override {
    Streams& s = streams(device_index);
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s.h2d), "cudaMemcpyAsync",
          "host to device, " + std::to_string(bytes) + " bytes to " + dev(device_index));
    return record(device_index, s, s.h2d);
  }

  void give_back(int device, cudaEvent_t ev) {
    std::lock_guard lk(mu_);
    devices_.at(device).events.push_back(ev);
  }

 private:
  struct Streams {
    cudaStream_t d2h = nullptr, h2d = nullptr;  // one per direction: both copy engines work at once
    std::vector<cudaEvent_t> events;            // free completion events of this device
  };

  // The device's streams, created on first use. Also makes `device` current on this thread (stage threads are the
  // flow graph's workers and serve every device).
  Streams& streams(int device) {
    check(cudaSetDevice(device), "cudaSetDevice", dev(device));
    std::lock_guard lk(mu_);
    auto [it, fresh] = devices_.try_emplace(device);
    if (fresh) {
      cudaError_t e = cudaStreamCreateWithFlags(&it->second.d2h, cudaStreamNonBlocking);
      if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&it->second.h2d, cudaStreamNonBlocking);
      if (e != cudaSuccess) devices_.erase(it);
      check(e, "cudaStreamCreateWithFlags", "copy streams of " + dev(device));
    }
    return it->second;
  }

  std::unique_ptr<CopyCompletion> record(int device, Streams& s, cudaStream_t stream) {
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard lk(mu_);
      if (!s.events.empty()) {
        ev = s.events.back();
        s.events.pop_back();
      }
    }
    // Blocking sync: the waiting stage thread sleeps instead of spinning a core the transports need.
    if (!ev) check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreate", dev(device));
    if (cudaError_t e = cudaEventRecord(ev, stream); e != cudaSuccess) {
      give_back(device, ev);
      check(e, "cudaEventRecord", "copy stream of " + dev(device));
    }
    return std::make_unique<EventCompletion>(this, device, ev);
  }

  std::mutex mu_;
  std::map<int, Streams> devices_;  // node-based: references stay valid as devices are added
};

EventCompletion::~EventCompletion() { owner_->give_back(device_, ev_); }

}  // namespace

std::shared_ptr<DeviceCopier> make_cuda_copier() { return std::make_shared<CudaCopier>(); }

}  // namespace commsched
