// The host-to-device copy stage through the engine, on the host stand-in (HostCopier): a fake backend that carries
// device memory only (NCCL's contract) gets host tensors (the control messages every backend must carry: the tuner's
// decision, broadcast_object, metric averages) through staging buffers on its device, copied in before and out after.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <set>
#include <vector>

#include "comm_backends/loopback/loopback_backend.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/stages/device_copy_stage.h"
#include "scheduler/stages/host_copier.h"
#include "tests/unit/device/fake_tensor.h"

namespace commsched {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr int kBackendDevice = 3;  // not 0, so a view left on the task's defaults would show

// Carries allreduce and broadcast of CUDA buffers on one device only, as NCCL does; the sums are a loopback group's.
// Fails a batch that reaches it with any other memory, and records the pointers it was handed.
class DeviceOnlyBackend final : public CommBackend {
 public:
  explicit DeviceOnlyBackend(std::shared_ptr<CommBackend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "device-only"; }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::allreduce, Op::broadcast}, {Device::cuda});
    c.cuda_device = kBackendDevice;
    return c;
  }
  void do_start(std::vector<PartitionView> batch, BatchDone /*sent*/, BatchDone done) override {
    for (const PartitionView& p : batch) {
      if (p.task->buffer.device != Device::cuda || p.task->buffer.device_index != kBackendDevice)
        return done(Status::Error("device-only backend got a partition of '" + p.task->name + "' that is not on cuda:" +
                                  std::to_string(kBackendDevice)));
      std::lock_guard lk(mu_);
      seen_.insert(p.data());
    }
    inner_->start(std::move(batch), std::move(done));
  }
  void shutdown() override { inner_->shutdown(); }
  bool saw(const std::byte* p) {
    std::lock_guard lk(mu_);
    return seen_.count(const_cast<std::byte*>(p)) > 0;
  }

 private:
  std::shared_ptr<CommBackend> inner_;
  std::mutex mu_;
  std::set<std::byte*> seen_;
};

struct Ranks {
  std::vector<std::shared_ptr<HostCopier>> copiers;
  std::vector<std::shared_ptr<DeviceCopyStage>> stages;
  std::vector<std::shared_ptr<DeviceOnlyBackend>> backends;
  std::vector<std::unique_ptr<Engine>> engines;
  Ranks(int n, uint64_t partition, compression::Spec compression = {}) {
    auto group = make_loopback_group(n);
    for (int r = 0; r < n; ++r) {
      copiers.push_back(std::make_shared<HostCopier>());
      backends.push_back(std::make_shared<DeviceOnlyBackend>(group[r]));
      stages.push_back(DeviceCopyStage::to_device(copiers.back(), backends.back()->capabilities().cuda_device));
      EngineConfig c;
      c.knobs.partition_bytes = partition;
      c.compression = compression;
      engines.push_back(std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(0), backends.back(), c,
                                                 std::vector<std::shared_ptr<Stage>>{stages.back()}));
    }
  }
};

Status wait_bounded(Engine& e) {
  if (!e.wait_all_for(30s)) {
    ADD_FAILURE() << "wait_all hung";
    return Status::Error("hung");
  }
  return e.wait_all();
}

struct Case {
  DType dtype;
  uint64_t count;
  uint64_t partition_bytes;
};

class HostToDevice : public ::testing::TestWithParam<Case> {};

TEST_P(HostToDevice, HostTensorsOnADeviceOnlyBackendSumExactlyThroughDeviceStagingBuffers) {
  const Case c = GetParam();
  constexpr int kRanks = 3, kIterations = 2;
  Ranks g(kRanks, c.partition_bytes);
  std::vector<FakeDeviceTensor> t;
  for (int r = 0; r < kRanks; ++r) t.emplace_back("metric.loss", c.dtype, c.count);
  const uint64_t parts = partition_count(c.count, c.dtype, c.partition_bytes);
  for (int it = 0; it < kIterations; ++it) {
    for (int r = 0; r < kRanks; ++r) {
      t[r].fill(r, 0, it);
      g.engines[r]->submit(t[r].task(Op::allreduce, Device::cpu));
    }
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(wait_bounded(*g.engines[r]).ok());
      ASSERT_EQ(t[r].first_wrong(kRanks, 0, it), -1) << "rank " << r << " iteration " << it;
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(g.copiers[r]->copies(), 2 * parts * kIterations) << "one copy in and one out per partition";
    EXPECT_FALSE(g.backends[r]->saw(t[r].bytes.data())) << "the backend was handed the host tensor itself";
    EXPECT_GE(g.copiers[r]->device_allocations(), 1u);
    EXPECT_LE(g.copiers[r]->device_allocations(), parts) << "staging buffers were not reused across iterations";
    EXPECT_EQ(g.copiers[r]->allocations(), 0u) << "host-to-device staging took pinned host memory";
    EXPECT_EQ(g.stages[r]->staging().leased, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndSizes, HostToDevice,
                         ::testing::Values(Case{DType::f32, 1, 0}, Case{DType::i64, 7, 0}, Case{DType::f64, 3000, 4096},
                                           Case{DType::f16, 10001, 2048}, Case{DType::bf16, 64, 0},
                                           Case{DType::i32, 50000, 65536}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_" + std::to_string(info.param.count) +
                                  "_partition" + std::to_string(info.param.partition_bytes);
                         });

// The tuner's decision and broadcast_object: an i64 broadcast from a host buffer.
TEST(HostToDeviceStage, ABroadcastFromHostMemoryReachesEveryRank) {
  constexpr int kRanks = 3;
  Ranks g(kRanks, 0);
  std::vector<FakeDeviceTensor> t;
  for (int r = 0; r < kRanks; ++r) {
    t.emplace_back("commsched.tuner.decision", DType::i64, 5);
    t[r].fill(r, 0, 0);
    Task task = t[r].task(Op::broadcast, Device::cpu);
    task.root = 2;
    g.engines[r]->submit(std::move(task));
    g.engines[r]->flush();
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(wait_bounded(*g.engines[r]).ok());
    for (uint64_t e = 0; e < 5; ++e) EXPECT_EQ(load(DType::i64, t[r].bytes.data() + 8 * e), value_of(2, 0, e, 0));
  }
}

TEST(HostToDeviceStage, CudaTensorsPassUntouched) {
  Ranks g(2, 4096);
  std::vector<FakeDeviceTensor> t;
  for (int r = 0; r < 2; ++r) t.emplace_back("fc.grad", DType::f32, 3000);
  for (int r = 0; r < 2; ++r) {
    t[r].fill(r, 0, 0);
    Task task = t[r].task(Op::allreduce);
    task.buffer.device_index = kBackendDevice;
    g.engines[r]->submit(std::move(task));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(wait_bounded(*g.engines[r]).ok());
    EXPECT_EQ(t[r].first_wrong(2, 0, 0), -1);
    EXPECT_EQ(g.copiers[r]->copies(), 0u);
    EXPECT_TRUE(g.backends[r]->saw(t[r].bytes.data())) << "a CUDA tensor was staged on its way to a CUDA backend";
  }
}

TEST(HostToDeviceStage, WithoutTheStageTheEngineRefusesAHostTensorSayingWhy) {
  Engine bare(std::make_unique<PriorityCreditPolicy>(0),
              std::make_shared<DeviceOnlyBackend>(make_loopback_group(1)[0]), EngineConfig{});
  FakeDeviceTensor t("broadcast_object.length", DType::i64, 1);
  try {
    bare.submit(t.task(Op::broadcast, Device::cpu));
    FAIL() << "a device-only backend accepted a host tensor without the stage";
  } catch (const InvalidArgument& e) {
    for (const char* part : {"'broadcast_object.length'", "device-only", "CPU", "host-to-device copy stage"})
      EXPECT_TRUE(contains(e.what(), part)) << "missing '" << part << "' in: " << e.what();
  }
}

TEST(HostToDeviceStage, AFailedCopyIsTheTasksErrorNamingTheTensorAndTheDevice) {
  for (uint64_t which : {0u, 1u}) {  // copy 0: in, copy 1: out
    Ranks g(1, 0);
    FakeDeviceTensor t("metric.accuracy", DType::f64, 4);
    t.fill(0, 0, 0);
    g.copiers[0]->fail_copy(which, "injected fault");
    g.engines[0]->submit(t.task(Op::allreduce, Device::cpu));
    const Status s = wait_bounded(*g.engines[0]);
    ASSERT_FALSE(s.ok());
    const char* direction = which == 0 ? "host-to-device copy" : "device-to-host copy";
    for (const char* part : {"host_to_device", "metric.accuracy", direction, "cuda:3", "injected fault"})
      EXPECT_TRUE(contains(s.message, part)) << "missing '" << part << "' in: " << s.message;
    EXPECT_EQ(g.stages[0]->staging().leased, 0u);
  }
}

// A compressed host tensor is encoded on the host (the codecs read host memory), then staged.
TEST(HostToDeviceStage, CompressionRunsOnTheHostBeforeTheCopy) {
  Ranks g(2, 4096, compression::Spec{compression::Scheme::fp16});
  std::vector<FakeDeviceTensor> t;
  for (int r = 0; r < 2; ++r) t.emplace_back("loss.sum", DType::f32, 5000);
  for (int r = 0; r < 2; ++r) {
    t[r].fill(r, 0, 0);
    g.engines[r]->submit(t[r].task(Op::allreduce, Device::cpu));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(wait_bounded(*g.engines[r]).ok());
    EXPECT_EQ(t[r].first_wrong(2, 0, 0), -1);
    EXPECT_EQ(g.copiers[r]->copies(), 2u * partition_count(5000, DType::f32, 4096));
  }
}

}  // namespace
}  // namespace commsched
