// NcclBackend on real GPUs. Without a CUDA device every test skips with a message saying so.
#include "comm_backends/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <numeric>

#include "cuda/cuda_devices.h"
#include "plugins/launch/process_group.h"
#include "scheduler/completion_waiter.h"
#include "tests/integration/collective/workload.h"

namespace commsched {
namespace {

using testing::WorkloadTask;

#define REQUIRE_GPUS(n)                                                                                          \
  do {                                                                                                           \
    const int have = cuda_device_count();                                                                        \
    if (have < (n))                                                                                              \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << have                                      \
                   << " (cudaGetDeviceCount failed or returned fewer); run scripts/gpu_checks.sh on a GPU machine"; \
  } while (0)

ClusterEnv env_for(int rank, int size, int port) {
  ClusterEnv e;
  e.num_workers = size;
  e.rank = rank;
  e.local_rank = rank;
  e.local_size = size;
  e.root_port = port;
  e.timeout_s = 10;
  return e;
}

// Runs one iteration of the random workload on device copies of the tasks; returns the first error or mismatch.
std::string run_on_gpu(NcclBackend& backend, int rank, int size, uint64_t seed) {
  auto tasks = testing::make_workload(seed, 16, 20000, 16 << 10, size, 0);
  testing::fill_inputs(tasks, rank);
  std::vector<void*> device_buffers;
  for (auto& t : tasks) {
    void* d = nullptr;
    if (cudaMalloc(&d, std::max<size_t>(t->data.size(), 1)) != cudaSuccess) return "cudaMalloc failed";
    cudaMemcpy(d, t->data.data(), t->data.size(), cudaMemcpyHostToDevice);
    t->desc.buffer = Buffer{d, Device::cuda, backend.device()};
    device_buffers.push_back(d);
  }
  CompletionWaiter done;
  for (auto& t : tasks)
    for (uint32_t i = 0; i < t->parts.size(); ++i)
      backend.start({PartitionView{&t->desc, i, t->parts[i].offset, t->parts[i].bytes}}, done.callback());
  const std::string error = done.wait(std::chrono::seconds(120)).message;
  for (size_t i = 0; i < tasks.size(); ++i) {
    cudaMemcpy(tasks[i]->data.data(), device_buffers[i], tasks[i]->data.size(), cudaMemcpyDeviceToHost);
    cudaFree(device_buffers[i]);
  }
  if (!error.empty()) return error;
  return testing::check_results(tasks, size);
}

TEST(NcclBackend, OneGpuCommunicatorMovesEveryDtypeIncludingFusedGroups) {
  REQUIRE_GPUS(1);
  NcclBackend backend(env_for(0, 1, free_loopback_port()));
  EXPECT_TRUE(backend.supports(Op::allreduce, Device::cuda));
  EXPECT_FALSE(backend.supports(Op::allreduce, Device::cpu));
  EXPECT_EQ(run_on_gpu(backend, 0, 1, 3), "");
  backend.shutdown();
}

TEST(NcclBackend, RejectsHostBuffersWithAClearError) {
  REQUIRE_GPUS(1);
  NcclBackend backend(env_for(0, 1, free_loopback_port()));
  float x[4] = {};
  TaskDesc t;
  t.name = "host.tensor";
  t.key = task_key(t.name);
  t.op = Op::allreduce;
  t.count = 4;
  t.buffer = Buffer{x, Device::cpu, 0};
  Status got;
  backend.start({PartitionView{&t, 0, 0, 16}}, [&](const Status& st) { got = st; });
  EXPECT_EQ(got.code, Status::Code::invalid);
  EXPECT_NE(got.message.find("host.tensor"), std::string::npos) << got.message;
}

TEST(NcclBackend, TwoGpusAsTwoRanksSumExactly) {
  REQUIRE_GPUS(2);
  const int port = free_loopback_port();
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::async(std::launch::async, [r, port] {
      cudaSetDevice(r);
      NcclBackend backend(env_for(r, 2, port));
      std::string result = run_on_gpu(backend, r, 2, 5);
      backend.shutdown();
      return result;
    }));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ranks[r].get(), "") << "rank " << r;
}

}  // namespace
}  // namespace commsched
