// The device-copy stage end to end through the engine, on the host stand-in (HostCopier): tasks say their buffer is
// on CUDA while their memory is host memory, so the staging path (pooled pinned buffers, copies on the copier's
// streams, events as completions, errors) runs here exactly as it does on a GPU, over loopback ranks and over an
// in-process parameter server.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/loopback/loopback_backend.h"
#include "comm_backends/ps/ps_backend.h"
#include "comm_backends/ps/server.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/stages/device_copy_stage.h"
#include "scheduler/stages/host_copier.h"
#include "tests/integration/harness/local_cluster.h"
#include "tests/unit/device/fake_tensor.h"

namespace commsched {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

EngineConfig config(uint64_t partition, uint64_t credit) {
  EngineConfig c;
  c.knobs.partition_bytes = partition;
  c.knobs.credit_bytes = credit;
  return c;
}

std::unique_ptr<Engine> make_engine(std::shared_ptr<CommBackend> b, uint64_t partition, uint64_t credit,
                                    std::shared_ptr<Stage> stage) {
  std::vector<std::shared_ptr<Stage>> stages;
  if (stage) stages.push_back(std::move(stage));
  return std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(credit), std::move(b), config(partition, credit),
                                  std::move(stages));
}

Status wait_bounded(Engine& e) {
  if (!e.wait_all_for(30s)) {
    ADD_FAILURE() << "wait_all hung";
    return Status::Error("hung");
  }
  return e.wait_all();
}

// Ranks over loopback, each with its own engine, stand-in copier and device-copy stage.
struct Group {
  std::vector<std::shared_ptr<HostCopier>> copiers;
  std::vector<std::shared_ptr<DeviceCopyStage>> stages;
  std::vector<std::unique_ptr<Engine>> engines;
  Group() = default;
  Group(int ranks, uint64_t partition, uint64_t credit) {
    auto backends = make_loopback_group(ranks);
    for (int r = 0; r < ranks; ++r) {
      copiers.push_back(std::make_shared<HostCopier>());
      stages.push_back(std::make_shared<DeviceCopyStage>(copiers.back()));
      engines.push_back(make_engine(backends[r], partition, credit, stages.back()));
    }
  }
};

// One iteration on every rank: fill, submit, end backward, wait, check exact sums.
void run_iteration(Group& g, std::vector<std::vector<FakeDeviceTensor>>& tensors, int iter, Op op = Op::push_pull) {
  const int ranks = static_cast<int>(g.engines.size());
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < tensors[r].size(); ++i) {
      tensors[r][i].fill(r, i, iter);
      Task t = tensors[r][i].task(op);
      t.priority = static_cast<int32_t>(i);
      g.engines[r]->submit(std::move(t));
    }
  for (auto& e : g.engines) e->backward_done();
  for (int r = 0; r < ranks; ++r) {
    const Status s = wait_bounded(*g.engines[r]);
    ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.message;
    for (size_t i = 0; i < tensors[r].size(); ++i)
      ASSERT_EQ(tensors[r][i].first_wrong(ranks, i, iter), -1)
          << "rank " << r << " tensor " << tensors[r][i].name << " iteration " << iter;
  }
}

std::vector<std::vector<FakeDeviceTensor>> model(int ranks, DType dtype) {
  std::vector<std::vector<FakeDeviceTensor>> t(ranks);
  const uint64_t counts[] = {1, 3, 1000, 40000, 100003};
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < std::size(counts); ++i) t[r].emplace_back("layer" + std::to_string(i) + ".grad", dtype, counts[i]);
  return t;
}

// ---------------------------------------------------------------- exact sums

struct SumCase {
  uint64_t partition_bytes;
  DType dtype;
};

class DeviceCopySums : public ::testing::TestWithParam<SumCase> {};

TEST_P(DeviceCopySums, ExactSumsThroughTheStagingBuffersAndEveryPartitionCopiedBothWays) {
  const SumCase c = GetParam();
  constexpr int kRanks = 2;
  Group g(kRanks, c.partition_bytes, 0);
  auto tensors = model(kRanks, c.dtype);
  uint64_t partitions = 0;
  for (const auto& t : tensors[0]) partitions += partition_count(t.count, t.dtype, c.partition_bytes);
  constexpr int kIterations = 3;
  for (int it = 0; it < kIterations; ++it) run_iteration(g, tensors, it);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(g.copiers[r]->copies(), 2 * partitions * kIterations) << "one copy to the host and one back per partition";
    const StagingStats s = g.stages[r]->staging();
    EXPECT_EQ(s.leases, partitions * kIterations);
    EXPECT_EQ(s.leased, 0u) << "every staging buffer went back to the pool";
    // Reused across iterations: never more buffers than one iteration's partitions (a buffer per copy would be
    // kIterations times that).
    EXPECT_LE(s.allocations, partitions);
  }
}

INSTANTIATE_TEST_SUITE_P(
    SizesAndDtypes, DeviceCopySums,
    ::testing::Values(SumCase{0, DType::f32}, SumCase{4096, DType::f32}, SumCase{1000, DType::f64},
                      SumCase{65536, DType::f16}, SumCase{12288, DType::bf16}, SumCase{4096, DType::i32},
                      SumCase{262144, DType::i64}),
    [](const auto& info) {
      return std::string(dtype_name(info.param.dtype)) + "_partition" + std::to_string(info.param.partition_bytes);
    });

TEST(DeviceCopyStage, BroadcastGoesThroughTheStagingBuffers) {
  Group g(3, 8192, 0);
  std::vector<std::vector<FakeDeviceTensor>> t(3);
  for (int r = 0; r < 3; ++r) {
    t[r].emplace_back("params", DType::f32, 30000);
    t[r][0].fill(r, 0, 0);
    Task task = t[r][0].task(Op::broadcast);
    task.root = 1;
    g.engines[r]->submit(std::move(task));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(wait_bounded(*g.engines[r]).ok());
    for (uint64_t e = 0; e < 30000; ++e)
      ASSERT_EQ(load(DType::f32, t[r][0].bytes.data() + 4 * e), value_of(1, 0, e, 0)) << "rank " << r << " element " << e;
  }
}

// ---------------------------------------------------------------- pooling

TEST(DeviceCopyStage, AfterTheFirstIterationNothingIsAllocated) {
  // Credit of one partition (no stall overdraft): one partition in flight at a time, so one staging buffer serves
  // every partition of every iteration.
  constexpr uint64_t kPartition = 16384;
  auto copier = std::make_shared<HostCopier>();
  auto stage = std::make_shared<DeviceCopyStage>(copier);
  Group g;
  g.copiers.push_back(copier);
  g.stages.push_back(stage);
  g.engines.push_back(std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(kPartition, 0, false),
                                               make_loopback_group(1)[0], config(kPartition, kPartition),
                                               std::vector<std::shared_ptr<Stage>>{stage}));
  std::vector<std::vector<FakeDeviceTensor>> tensors(1);
  tensors[0].emplace_back("a.grad", DType::f32, 10 * kPartition / 4);  // ten full partitions
  tensors[0].emplace_back("b.grad", DType::f32, 3 * kPartition / 4 - 5);  // two full, one a little shorter
  run_iteration(g, tensors, 0);
  EXPECT_EQ(stage->staging().allocations, 1u);
  for (int it = 1; it < 10; ++it) run_iteration(g, tensors, it);
  EXPECT_EQ(stage->staging().allocations, 1u) << "iterations after the first allocated staging buffers";
  EXPECT_EQ(stage->staging().leases, 13u * 10);
  EXPECT_EQ(copier->allocations(), 1u);
}

TEST(DeviceCopyStage, CpuTensorsKeepTheZeroCopyPath) {
  Group g(2, 4096, 0);
  std::vector<std::vector<FakeDeviceTensor>> t(2);
  for (int r = 0; r < 2; ++r) {
    t[r].emplace_back("cpu.grad", DType::f32, 20000);
    t[r][0].fill(r, 0, 0);
    g.engines[r]->submit(t[r][0].task(Op::push_pull, Device::cpu));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(wait_bounded(*g.engines[r]).ok());
    EXPECT_EQ(t[r][0].first_wrong(2, 0, 0), -1);
    EXPECT_EQ(g.copiers[r]->copies(), 0u);
    EXPECT_EQ(g.stages[r]->staging().leases, 0u);
  }
}

// ---------------------------------------------------------------- ordering and pipelining

TEST(DeviceCopyStage, TheCopyWaitsForTheProducersReadyEvent) {
  Group g(2, 4096, 0);
  std::vector<std::vector<FakeDeviceTensor>> t(2);
  std::vector<std::promise<void>> produced(2);
  std::vector<HostReadyEvent> ready;
  for (int r = 0; r < 2; ++r) ready.push_back(produced[r].get_future().share());
  for (int r = 0; r < 2; ++r) {
    t[r].emplace_back("late.grad", DType::f32, 50000);
    std::fill(t[r][0].bytes.begin(), t[r][0].bytes.end(), std::byte{0x7f});  // not yet written by the "producer"
    Task task = t[r][0].task(Op::push_pull);
    task.buffer.ready_event = &ready[r];
    g.engines[r]->submit(std::move(task));
  }
  for (auto& e : g.engines) e->backward_done();
  std::this_thread::sleep_for(50ms);  // the engine dispatches meanwhile; its copies must not read yet
  for (int r = 0; r < 2; ++r) {
    t[r][0].fill(r, 0, 0);
    produced[r].set_value();
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(wait_bounded(*g.engines[r]).ok());
    EXPECT_EQ(t[r][0].first_wrong(2, 0, 0), -1) << "a copy read the tensor before its producer was done";
  }
}

// Counts copies to the host that are in flight together; each waits (bounded) until `want` are.
class GatheringCopier final : public DeviceCopier {
 public:
  explicit GatheringCopier(int want) : want_(want) {}
  std::string_view name() const override { return "gathering"; }
  std::byte* alloc_host(size_t bytes) override { return inner_.alloc_host(bytes); }
  void free_host(std::byte* p) noexcept override { inner_.free_host(p); }
  std::byte* alloc_device(size_t bytes, int device) override { return inner_.alloc_device(bytes, device); }
  void free_device(std::byte* p, int device) noexcept override { inner_.free_device(p, device); }
  std::unique_ptr<CopyCompletion> to_host(std::byte* h, const std::byte* d, size_t n, int i, void* r) override {
    std::unique_lock lk(mu_);
    ++inside_;
    most_ = std::max(most_, inside_);
    cv_.notify_all();
    cv_.wait_for(lk, 10s, [&] { return most_ >= want_; });
    --inside_;
    lk.unlock();
    return inner_.to_host(h, d, n, i, r);
  }
  std::unique_ptr<CopyCompletion> to_device(std::byte* d, const std::byte* h, size_t n, int i) override {
    return inner_.to_device(d, h, n, i);
  }
  int most() {
    std::lock_guard lk(mu_);
    return most_;
  }

 private:
  HostCopier inner_;
  const int want_;
  std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0, most_ = 0;
};

TEST(DeviceCopyStage, PartitionsOfOneTensorCopyInParallel) {
  auto copier = std::make_shared<GatheringCopier>(2);
  auto stage = std::make_shared<DeviceCopyStage>(copier);
  ASSERT_GT(stage->concurrency(), 1u);
  auto engine = make_engine(make_loopback_group(1)[0], 4096, 0, stage);
  FakeDeviceTensor t("big.grad", DType::f32, 8 * 1024);  // eight partitions
  t.fill(0, 0, 0);
  const auto t0 = std::chrono::steady_clock::now();
  engine->submit(t.task(Op::push_pull));
  ASSERT_TRUE(wait_bounded(*engine).ok());
  EXPECT_EQ(t.first_wrong(1, 0, 0), -1);
  EXPECT_GE(copier->most(), 2) << "the partitions' copies ran one at a time";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "the copies only met at the deadline";
}

// ---------------------------------------------------------------- errors

TEST(DeviceCopyStage, AFailedCopyToTheHostIsTheTasksErrorNamingTheTensor) {
  Group g(1, 0, 0);
  FakeDeviceTensor t("encoder.layer3.weight", DType::f32, 1000);
  t.fill(0, 0, 0);
  g.copiers[0]->fail_copy(0, "injected copy fault");
  Status seen;
  Task task = t.task(Op::push_pull);
  task.on_done = [&](const Status& s) { seen = s; };
  g.engines[0]->submit(std::move(task));
  const Status s = wait_bounded(*g.engines[0]);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(seen.ok()) << "the task's own callback got no error";
  for (const char* part : {"device_copy", "encoder.layer3.weight", "device-to-host copy", "cuda:0", "injected copy fault"})
    EXPECT_TRUE(contains(s.message, part)) << "missing '" << part << "' in: " << s.message;
  EXPECT_EQ(g.stages[0]->staging().leased, 0u) << "the failed partition's staging buffer leaked";
  // The stage keeps working after a failure.
  std::vector<std::vector<FakeDeviceTensor>> again = model(1, DType::f32);
  run_iteration(g, again, 1);
}

TEST(DeviceCopyStage, AFailedCopyBackIsTheTasksErrorNamingTheTensor) {
  Group g(1, 0, 0);
  FakeDeviceTensor t("head.bias", DType::f64, 77);
  t.fill(0, 0, 0);
  g.copiers[0]->fail_copy(1, "injected fault on the way back");  // copy 0: to the host; copy 1: back
  g.engines[0]->submit(t.task(Op::push_pull));
  const Status s = wait_bounded(*g.engines[0]);
  ASSERT_FALSE(s.ok());
  for (const char* part : {"device_copy", "head.bias", "host-to-device copy", "injected fault on the way back"})
    EXPECT_TRUE(contains(s.message, part)) << "missing '" << part << "' in: " << s.message;
  EXPECT_EQ(g.stages[0]->staging().leased, 0u);
}

// ---------------------------------------------------------------- acceptance at submit

TEST(DeviceCopyStage, AHostOnlyBackendRefusesCudaTasksWithoutTheStageAndTakesThemWithIt) {
  FakeDeviceTensor t("w", DType::f32, 10);
  auto bare = make_engine(make_loopback_group(1)[0], 0, 0, nullptr);
  try {
    bare->submit(t.task(Op::push_pull));
    FAIL() << "a CUDA task was accepted by a host-only backend without the device-copy stage";
  } catch (const InvalidArgument& e) {
    for (const char* part : {"'w'", "loopback", "cannot carry", "CUDA", "device-copy stage"})
      EXPECT_TRUE(contains(e.what(), part)) << "missing '" << part << "' in: " << e.what();
  }
  Group g(1, 0, 0);
  t.fill(0, 0, 0);
  EXPECT_NO_THROW(g.engines[0]->submit(t.task(Op::push_pull)));
  EXPECT_TRUE(wait_bounded(*g.engines[0]).ok());
}

// A backend that takes CUDA buffers as they are (NCCL's contract), completing at once.
class CudaTakingBackend final : public CommBackend {
 public:
  std::string_view name() const override { return "cuda-taking"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::push_pull, Op::allreduce, Op::broadcast}, {Device::cpu, Device::cuda});
    return c;
  }
  void do_start(std::vector<PartitionView>, BatchDone /*sent*/, BatchDone done) override { done(Status::Ok()); }
  void shutdown() override {}
};

TEST(DeviceCopyStage, CompressionOfACudaBufferTheBackendTakesAsItIsIsRefused) {
  auto engine = make_engine(std::make_shared<CudaTakingBackend>(), 0, 0, nullptr);
  FakeDeviceTensor t("emb", DType::f32, 10);
  Task task = t.task(Op::allreduce);
  task.compression = compression::Spec{compression::Scheme::fp16};
  try {
    engine->submit(std::move(task));
    FAIL() << "the CPU codec was handed a CUDA buffer";
  } catch (const InvalidArgument& e) {
    for (const char* part : {"'emb'", "compression", "host memory"})
      EXPECT_TRUE(contains(e.what(), part)) << "missing '" << part << "' in: " << e.what();
  }
}

TEST(DeviceCopyStage, CompressionRunsOnTheStagedHostCopy) {
  constexpr int kRanks = 2;
  auto backends = make_loopback_group(kRanks);
  std::vector<std::shared_ptr<HostCopier>> copiers;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<FakeDeviceTensor> t;
  for (int r = 0; r < kRanks; ++r) {
    copiers.push_back(std::make_shared<HostCopier>());
    EngineConfig c = config(4096, 0);
    c.compression = compression::Spec{compression::Scheme::fp16};  // small integers survive the cast exactly
    engines.push_back(std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(0), backends[r], c,
                                               std::vector<std::shared_ptr<Stage>>{std::make_shared<DeviceCopyStage>(copiers.back())}));
    t.emplace_back("fc.weight", DType::f32, 9000);
  }
  for (int r = 0; r < kRanks; ++r) {
    t[r].fill(r, 0, 0);
    engines[r]->submit(t[r].task(Op::push_pull));
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(wait_bounded(*engines[r]).ok());
    EXPECT_EQ(t[r].first_wrong(kRanks, 0, 0), -1);
    EXPECT_EQ(copiers[r]->copies(), 2u * partition_count(9000, DType::f32, 4096));
  }
}

// ---------------------------------------------------------------- the parameter server

// One server and two workers in this process, over ZeroMQ on loopback; each worker's engine has the stage.
TEST(DeviceCopyStage, ParameterServerSumsCudaTensorsThroughTheStage) {
  constexpr int kWorkers = 2;
  ClusterEnv base;
  base.num_workers = kWorkers;
  base.num_servers = 1;
  base.root_port = testing::free_tcp_port();
  base.timeout_s = 20;
  ClusterEnv server_env = base;
  server_env.role = Role::server;
  std::future<int> server = std::async(std::launch::async, [&] { return run_server(server_env, PsConfig{}); });
  std::vector<std::shared_ptr<CommBackend>> backends(kWorkers);
  {
    std::vector<std::thread> joins;
    for (int r = 0; r < kWorkers; ++r)
      joins.emplace_back([&, r] {
        ClusterEnv e = base;
        e.rank = r;
        backends[r] = std::make_shared<PsBackend>(e, PsConfig{});
      });
    for (auto& j : joins) j.join();
  }
  std::vector<std::vector<FakeDeviceTensor>> tensors = model(kWorkers, DType::f32);
  Group g;
  for (int r = 0; r < kWorkers; ++r) {
    g.copiers.push_back(std::make_shared<HostCopier>());
    g.stages.push_back(std::make_shared<DeviceCopyStage>(g.copiers.back()));
    g.engines.push_back(make_engine(backends[r], 65536, 1 << 20, g.stages.back()));
  }
  for (int it = 0; it < 3; ++it) run_iteration(g, tensors, it);
  for (int r = 0; r < kWorkers; ++r) EXPECT_GT(g.copiers[r]->copies(), 0u);
  // Without the stage the PS refuses a CUDA task, saying which backend and why. (This engine's end shuts worker 0's
  // backend down, which the last step does anyway.)
  {
    Engine bare(std::make_unique<PriorityCreditPolicy>(0), backends[0], config(0, 0));
    FakeDeviceTensor probe("probe", DType::f32, 4);
    try {
      bare.submit(probe.task(Op::push_pull));
      ADD_FAILURE() << "the PS took a CUDA task without the device-copy stage";
    } catch (const InvalidArgument& e) {
      for (const char* part : {"'probe'", "'ps'", "cannot carry", "CUDA"})
        EXPECT_TRUE(contains(e.what(), part)) << "missing '" << part << "' in: " << e.what();
    }
  }
  g.engines.clear();  // goodbyes: the server ends
  backends.clear();
  ASSERT_EQ(server.wait_for(20s), std::future_status::ready) << "the server did not end after the goodbyes";
  EXPECT_EQ(server.get(), 0);
}

}  // namespace
}  // namespace commsched
