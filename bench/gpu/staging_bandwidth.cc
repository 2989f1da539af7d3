// Bandwidth of the device-copy stage's staging path (device → pinned host → device, per partition, through the
// engine on a one-rank loopback backend, so only the copies and the engine cost time) against plain cudaMemcpy of
// the same bytes between the device and one pinned buffer, side by side in one run.
//
//   staging_bandwidth [total MiB, default 512] [partition KiB, default 4096] [repetitions, default 5]
//
// Prints one line per path: "<path> <GB/s>" (bytes moved both ways, divided by the best repetition's time) and the
// ratio staging/plain.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm_backends/loopback/loopback_backend.h"
#include "cuda/cuda_devices.h"
#include "cuda/cuda_copier.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/stages/device_copy_stage.h"

using namespace commsched;
using Clock = std::chrono::steady_clock;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best time of `reps` runs of D2H then H2D of `bytes` with cudaMemcpy (pinned host memory: the copy engines' peak).
double plain_seconds(void* dev, void* pinned, size_t bytes, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    check(cudaMemcpy(pinned, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    check(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// Best time of `reps` push_pulls of the whole tensor through the engine with the device-copy stage.
double staging_seconds(void* dev, size_t bytes, size_t partition, int reps, StagingStats* stats) {
  auto stage = std::make_shared<DeviceCopyStage>(make_cuda_copier());
  EngineConfig c;
  c.knobs.partition_bytes = partition;
  c.knobs.credit_bytes = 0;
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), make_loopback_group(1)[0], c, {stage});
  double best = 1e30;
  for (int i = 0; i < reps + 1; ++i) {  // the first run warms the staging pool up
    Task t;
    t.name = "tensor";
    t.op = Op::push_pull;
    t.dtype = DType::f32;
    t.count = bytes / 4;
    t.buffer = Buffer{dev, Device::cuda, 0};
    const auto t0 = Clock::now();
    engine.submit(std::move(t));
    const Status s = engine.wait_all();
    if (!s.ok()) throw std::runtime_error(s.message);
    if (i > 0) best = std::min(best, seconds_since(t0));
  }
  *stats = stage->staging();
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const size_t total = (argc > 1 ? std::stoull(argv[1]) : 512) << 20;
    const size_t partition = (argc > 2 ? std::stoull(argv[2]) : 4096) << 10;
    const int reps = argc > 3 ? std::stoi(argv[3]) : 5;
    if (cuda_device_count() < 1) {
      std::fprintf(stderr, "staging_bandwidth: no CUDA device\n");
      return 2;
    }
    void* dev = nullptr;
    void* pinned = nullptr;
    check(cudaMalloc(&dev, total), "cudaMalloc");
    check(cudaMemset(dev, 0, total), "cudaMemset");
    check(cudaMallocHost(&pinned, total), "cudaMallocHost");
    const double plain = plain_seconds(dev, pinned, total, reps);
    StagingStats stats;
    const double staged = staging_seconds(dev, total, partition, reps, &stats);
    const double moved = 2.0 * static_cast<double>(total);
    std::printf("bytes %zu partition %zu repetitions %d\n", total, partition, reps);
    std::printf("plain_cudaMemcpy_GBps %.2f\n", moved / plain / 1e9);
    std::printf("staging_engine_GBps %.2f\n", moved / staged / 1e9);
    std::printf("staging_over_plain %.3f\n", plain / staged);
    std::printf("staging_allocations %llu leases %llu\n", static_cast<unsigned long long>(stats.allocations),
                static_cast<unsigned long long>(stats.leases));
    cudaFreeHost(pinned);
    cudaFree(dev);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "staging_bandwidth: %s\n", e.what());
    return 1;
  }
}
