// The device-copy stage on CUDA: CudaCopier's copies and events, exact sums of cudaMalloc'd tensors through the engine,
// the copy waiting for the producer's event, and CUDA errors as the task's error. Needs a GPU (skips without one, and
// scripts/gpu_checks.sh runs it with skips counted as failures); the composition test needs none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm_backends/loopback/loopback_backend.h"
#include "comm_backends/nccl/nccl_backend.h"
#include "cuda/cuda_devices.h"
#include "cuda/cuda_copier.h"
#include "plugins/api/context.h"
#include "plugins/launch/process_group.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/stages/device_copy_stage.h"

namespace commsched {
namespace {

using namespace std::chrono_literals;

#define REQUIRE_GPU()                                                                                         \
  do {                                                                                                        \
    if (cuda_device_count() < 1)                                                                              \
      GTEST_SKIP() << "needs a CUDA device, found none (cudaGetDeviceCount failed or returned 0); run "        \
                      "scripts/gpu_checks.sh on a GPU machine";                                               \
  } while (0)

void ok(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

struct DeviceTensor {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceTensor(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess); }
  ~DeviceTensor() { cudaFree(ptr); }
  void upload(const void* host) { EXPECT_EQ(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice), cudaSuccess); }
  void download(void* host) const { EXPECT_EQ(cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess); }
};

Task cuda_task(const std::string& name, DType dtype, uint64_t count, void* ptr) {
  Task t;
  t.name = name;
  t.op = Op::push_pull;
  t.dtype = dtype;
  t.count = count;
  t.buffer = Buffer{ptr, Device::cuda, 0};
  return t;
}

std::unique_ptr<Engine> engine_over(std::shared_ptr<CommBackend> b, std::shared_ptr<Stage> stage, uint64_t partition) {
  EngineConfig c;
  c.knobs.partition_bytes = partition;
  c.knobs.credit_bytes = 0;
  return std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(0), std::move(b), c,
                                  std::vector<std::shared_ptr<Stage>>{std::move(stage)});
}

TEST(CudaCopy, ContextStagesCudaTensorsForHostOnlyBackends) {
  // No GPU needed: the composition only. Loopback carries host memory only, so a CUDA build stages.
  auto group = Context::loopback_group(1, LinkModel{});
  EXPECT_TRUE(group[0]->stages_device_copies());
}

TEST(CudaCopy, RoundTripThroughPinnedMemoryOnTheCopyStreams) {
  REQUIRE_GPU();
  auto copier = make_cuda_copier();
  constexpr size_t kBytes = 3 << 20;
  std::vector<uint8_t> pattern(kBytes);
  for (size_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<uint8_t>(i * 31 + 7);
  DeviceTensor d(kBytes);
  d.upload(pattern.data());
  std::byte* host = copier->alloc_host(kBytes);
  copier->to_host(host, static_cast<std::byte*>(d.ptr), kBytes, 0, nullptr)->wait();
  EXPECT_EQ(std::memcmp(host, pattern.data(), kBytes), 0);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<std::byte>(~pattern[i]);
  copier->to_device(static_cast<std::byte*>(d.ptr), host, kBytes, 0)->wait();
  std::vector<uint8_t> back(kBytes);
  d.download(back.data());
  for (size_t i = 0; i < kBytes; i += 4097) ASSERT_EQ(back[i], static_cast<uint8_t>(~pattern[i])) << "byte " << i;
  copier->free_host(host);
}

TEST(CudaCopy, ExactSumsOfDeviceTensorsThroughTheEngineAndBuffersReused) {
  REQUIRE_GPU();
  constexpr int kRanks = 2;
  constexpr uint64_t kCount = 1'000'003;  // 4 MB of f32: 62 partitions of 64 KiB, the last one short
  auto backends = make_loopback_group(kRanks);
  std::vector<std::shared_ptr<DeviceCopyStage>> stages;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::unique_ptr<DeviceTensor>> tensors;
  for (int r = 0; r < kRanks; ++r) {
    stages.push_back(std::make_shared<DeviceCopyStage>(make_cuda_copier()));
    engines.push_back(engine_over(backends[r], stages.back(), 65536));
    tensors.push_back(std::make_unique<DeviceTensor>(kCount * 4));
  }
  std::vector<float> host(kCount);
  uint64_t after_first = 0;
  for (int it = 0; it < 4; ++it) {
    for (int r = 0; r < kRanks; ++r) {
      for (uint64_t e = 0; e < kCount; ++e) host[e] = static_cast<float>((r + e + it) % 7);
      tensors[r]->upload(host.data());
      engines[r]->submit(cuda_task("conv1.weight", DType::f32, kCount, tensors[r]->ptr));
    }
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(engines[r]->wait_all_for(60s));
      const Status s = engines[r]->wait_all();
      ASSERT_TRUE(s.ok()) << s.message;
      tensors[r]->download(host.data());
      for (uint64_t e = 0; e < kCount; ++e)
        ASSERT_EQ(host[e], static_cast<float>((e + it) % 7 + (1 + e + it) % 7)) << "rank " << r << " element " << e;
    }
    if (it == 0) after_first = stages[0]->staging().allocations;
  }
  // Reused: at most one iteration's partitions in all (a buffer per copy would be four times that).
  EXPECT_GE(after_first, 1u);
  EXPECT_LE(stages[0]->staging().allocations, partition_count(kCount, DType::f32, 65536));
}

void CUDART_CB sleep_on_stream(void*) { std::this_thread::sleep_for(100ms); }

TEST(CudaCopy, TheCopyWaitsForTheProducersEvent) {
  REQUIRE_GPU();
  constexpr uint64_t kCount = 1 << 20;
  auto backend = make_loopback_group(1)[0];
  auto stage = std::make_shared<DeviceCopyStage>(make_cuda_copier());
  auto engine = engine_over(backend, stage, 1 << 20);
  DeviceTensor d(kCount * 4);
  ok(cudaMemset(d.ptr, 0xff, d.bytes), "cudaMemset");  // NaNs until the producer writes
  std::vector<float> want(kCount, 3.0f);
  float* pinned = nullptr;
  ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), d.bytes), "cudaMallocHost");
  std::memcpy(pinned, want.data(), d.bytes);
  cudaStream_t producer;
  cudaEvent_t ready;
  ok(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), "cudaStreamCreate");
  ok(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  // The "gradient" lands 100 ms from now, on the producer's stream; the task is submitted at once.
  ok(cudaLaunchHostFunc(producer, sleep_on_stream, nullptr), "cudaLaunchHostFunc");
  ok(cudaMemcpyAsync(d.ptr, pinned, d.bytes, cudaMemcpyHostToDevice, producer), "cudaMemcpyAsync");
  ok(cudaEventRecord(ready, producer), "cudaEventRecord");
  Task t = cuda_task("late.grad", DType::f32, kCount, d.ptr);
  t.buffer.ready_event = ready;
  engine->submit(std::move(t));
  ASSERT_TRUE(engine->wait_all_for(30s));
  ASSERT_TRUE(engine->wait_all().ok());
  std::vector<float> got(kCount);
  d.download(got.data());
  for (uint64_t e = 0; e < kCount; e += 1021) ASSERT_EQ(got[e], 3.0f) << "element " << e << ": read before the producer";
  cudaEventDestroy(ready);
  cudaStreamDestroy(producer);
  cudaFreeHost(pinned);
}

TEST(CudaCopy, ACudaErrorIsTheTasksErrorNamingTheCallAndTheTensor) {
  REQUIRE_GPU();
  auto engine = engine_over(make_loopback_group(1)[0], std::make_shared<DeviceCopyStage>(make_cuda_copier()), 0);
  DeviceTensor d(4096);
  Task t = cuda_task("bad.device", DType::f32, 1024, d.ptr);
  t.buffer.device_index = 9999;
  engine->submit(std::move(t));
  ASSERT_TRUE(engine->wait_all_for(30s));
  const Status s = engine->wait_all();
  ASSERT_FALSE(s.ok());
  for (const char* part : {"bad.device", "device_copy", "cudaSetDevice", "cuda:9999"})
    EXPECT_NE(s.message.find(part), std::string::npos) << "missing '" << part << "' in: " << s.message;
}

// NCCL in a real run: the Context puts the host-to-device stage in front of the NCCL backend, so the control
// messages on host tensors (the tuner's decision and broadcast_object are i64/i32 broadcasts, a metric average an f32
// all-reduce) reach the communicator through staging buffers on its device, beside CUDA tensors that go as they are.
TEST(CudaCopy, ContextOnNcclCarriesHostTensorsThroughTheHostToDeviceStage) {
  REQUIRE_GPU();
  ContextOptions o;
  o.backend = "nccl";
  o.cluster = ClusterEnv{};
  o.cluster->root_port = free_loopback_port();
  o.cluster->timeout_s = 10;
  Context ctx(o);
  EXPECT_FALSE(ctx.stages_device_copies()) << "CUDA tensors on NCCL must not go through host staging";
  int64_t decision[5] = {11, -2, 3, 1 << 20, 1};
  float metric[1000];
  for (int i = 0; i < 1000; ++i) metric[i] = static_cast<float>(i % 17);
  DeviceTensor grad(4096 * sizeof(float));
  std::vector<float> g(4096, 2.5f);
  grad.upload(g.data());
  Task b;
  b.name = "commsched.tuner.decision";
  b.op = Op::broadcast;
  b.dtype = DType::i64;
  b.count = 5;
  b.buffer.data = decision;
  ctx.engine().submit(std::move(b));
  Task m;
  m.name = "metric.loss";
  m.op = Op::allreduce;
  m.dtype = DType::f32;
  m.count = 1000;
  m.buffer.data = metric;
  ctx.engine().submit(std::move(m));
  Task c = cuda_task("fc.grad", DType::f32, 4096, grad.ptr);
  c.op = Op::allreduce;
  ctx.engine().submit(std::move(c));
  ctx.engine().flush();
  ASSERT_TRUE(ctx.engine().wait_all_for(60s));
  const Status s = ctx.engine().wait_all();
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(decision[0], 11);
  EXPECT_EQ(decision[3], 1 << 20);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(metric[i], static_cast<float>(i % 17)) << "element " << i;
  grad.download(g.data());
  EXPECT_EQ(g[4095], 2.5f);
}

// The stage on a CUDA copier beside a real NCCL communicator: host tensors of every dtype sum exactly (one rank: the
// sum is the input, so what is checked is the round trip through the device staging buffers and the communicator).
TEST(CudaCopy, HostToDeviceStageOnNcclRoundTripsEveryDtype) {
  REQUIRE_GPU();
  ClusterEnv env;
  env.root_port = free_loopback_port();
  env.timeout_s = 10;
  auto nccl = std::make_shared<NcclBackend>(env);
  auto stage = DeviceCopyStage::to_device(make_cuda_copier(), nccl->device());
  auto engine = engine_over(nccl, stage, 4096);
  std::vector<std::vector<std::byte>> host;
  const DType dtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};
  for (DType d : dtypes) {
    std::vector<std::byte> bytes(10007 * dtype_size(d));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>((i * 31) % 251 & 0x3f);
    host.push_back(bytes);
  }
  std::vector<std::vector<std::byte>> want = host;
  for (size_t k = 0; k < host.size(); ++k) {
    Task t;
    t.name = std::string("host.") + std::string(dtype_name(dtypes[k]));
    t.op = Op::allreduce;
    t.dtype = dtypes[k];
    t.count = 10007;
    t.buffer.data = host[k].data();
    engine->submit(std::move(t));
  }
  engine->flush();
  ASSERT_TRUE(engine->wait_all_for(60s));
  const Status s = engine->wait_all();
  ASSERT_TRUE(s.ok()) << s.message;
  for (size_t k = 0; k < host.size(); ++k) EXPECT_EQ(host[k], want[k]) << dtype_name(dtypes[k]);
  EXPECT_EQ(stage->staging().leased, 0u);
  EXPECT_GT(stage->staging().allocations, 0u);
}

}  // namespace
}  // namespace commsched
