// Compression as an engine stage: what reaches the backend, what comes back, and which backends refuse what.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/half.h"
#include "comm_backends/loopback/loopback_backend.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

using compression::Scheme;
using compression::Spec;

EngineConfig config(Spec s, uint64_t partition = 1024) {
  EngineConfig c;
  c.knobs.partition_bytes = partition;
  c.knobs.credit_bytes = 0;
  c.compression = s;
  return c;
}

Task task(std::string name, Op op, std::vector<float>& buf) {
  Task t;
  t.name = std::move(name);
  t.op = op;
  t.dtype = DType::f32;
  t.count = buf.size();
  t.buffer.data = buf.data();
  return t;
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + 1.0f) * (1 + i % 7);
  return v;
}

// Two loopback ranks sum fp16 partitions: the result is the fp16 sum, and half the bytes went to the backend.
TEST(CompressionStage, Fp16SumsOnTheWireAcrossRanks) {
  for (Op op : {Op::allreduce, Op::push_pull}) {
    auto group = make_loopback_group(2);
    std::vector<std::unique_ptr<Engine>> engines;
    for (auto& b : group) engines.push_back(std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(0), b, config({Scheme::fp16})));
    std::vector<std::vector<float>> data = {ramp(1001, 1.0f), ramp(1001, -0.5f)};
    const std::vector<std::vector<float>> in = data;
    for (int r = 0; r < 2; ++r) engines[r]->submit(task("g", op, data[r]));
    for (auto& e : engines) ASSERT_TRUE(e->wait_all().ok());
    for (size_t i = 0; i < in[0].size(); ++i) {
      const float want = in[0][i] + in[1][i];
      for (int r = 0; r < 2; ++r) {
        ASSERT_NEAR(data[r][i], want, 4e-3f * (1 + std::abs(want))) << "rank " << r << " element " << i;
        ASSERT_EQ(f16_to_f32(f32_to_f16(data[r][i])), data[r][i]) << "the result is an fp16 value";
      }
    }
    const auto st = engines[0]->stats();
    EXPECT_EQ(st.bytes_dispatched, 1001u * 4);
    EXPECT_EQ(st.wire_bytes, 1001u * 2);
  }
}

// One rank: what comes back is what top-k sent; what it did not send is sent in later rounds (error feedback).
TEST(CompressionStage, TopKSendsTheLargestAndLaterTheResidual) {
  auto group = make_loopback_group(1);
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), group[0], config({Scheme::topk, 0.1}, /*partition=*/400));
  const std::vector<float> grad = ramp(1050, 1.0f);  // 11 partitions: ten of 100 elements and one of 50
  std::vector<float> buf = grad;
  engine.submit(task("g", Op::push_pull, buf));
  ASSERT_TRUE(engine.wait_all().ok());
  size_t nonzero = 0;
  for (size_t i = 0; i < buf.size(); ++i)
    if (buf[i] != 0) {
      ++nonzero;
      ASSERT_EQ(buf[i], grad[i]) << "a sent element arrives exactly";
    }
  EXPECT_EQ(nonzero, 10u * 10 + 5) << "ceil(0.1 n) per partition";
  EXPECT_EQ(engine.stats().wire_bytes, 105u * 8);
  // A zero gradient next round: what arrives is the residual's largest, i.e. elements not sent before.
  std::vector<float> zero(1050, 0.0f);
  engine.submit(task("g", Op::push_pull, zero));
  ASSERT_TRUE(engine.wait_all().ok());
  size_t resent = 0;
  for (size_t i = 0; i < zero.size(); ++i)
    if (zero[i] != 0) {
      ++resent;
      ASSERT_EQ(buf[i], 0.0f) << "element " << i << " was already sent";
      ASSERT_EQ(zero[i], grad[i]) << "the residual holds the unsent gradient";
    }
  EXPECT_EQ(resent, 105u);
}

TEST(CompressionStage, SignSgdOnOneRankSendsSignTimesScale) {
  auto group = make_loopback_group(1);
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), group[0], config({Scheme::signsgd}, 0));
  const std::vector<float> grad = ramp(333, 2.0f);
  std::vector<float> buf = grad;
  engine.submit(task("g", Op::push_pull, buf));
  ASSERT_TRUE(engine.wait_all().ok());
  double l1 = 0;
  for (float g : grad) l1 += std::abs(g);
  for (size_t i = 0; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i] >= 0, grad[i] >= 0);
    ASSERT_NEAR(std::abs(buf[i]), l1 / grad.size(), 1e-4);
  }
  EXPECT_EQ(engine.stats().wire_bytes, 4u + 11 * 4);
}

TEST(CompressionStage, SchemesWithoutAWireSumAreRefusedForAllreduceAndForBackendsThatCannotSumThem) {
  for (Spec s : {Spec{Scheme::topk, 0.01}, Spec{Scheme::signsgd}}) {
    auto two = make_loopback_group(2);
    Engine engine(std::make_unique<PriorityCreditPolicy>(0), two[0], config(s));
    std::vector<float> buf(100, 1.0f);
    try {
      engine.submit(task("a", Op::allreduce, buf));
      FAIL() << "allreduce with " << compression::to_string(s) << " accepted";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("compression '" + std::string(compression::scheme_name(s.scheme)) + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("allreduce on backend 'loopback'"), std::string::npos) << m;
    }
    try {
      engine.submit(task("p", Op::push_pull, buf));
      FAIL() << "2-rank push_pull with " << compression::to_string(s) << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("backend 'loopback' (2 ranks)"), std::string::npos) << e.what();
    }
    // A task may opt out; then it is accepted (both ranks take part, or the sum would wait for the other).
    Engine other(std::make_unique<PriorityCreditPolicy>(0), two[1], config(s));
    std::vector<float> buf2(100, 2.0f);
    for (auto [e, b] : {std::pair{&engine, &buf}, std::pair{&other, &buf2}}) {
      Task plain = task("q", Op::allreduce, *b);
      plain.compression = Spec{};
      e->submit(std::move(plain));
    }
    ASSERT_TRUE(engine.wait_all_for(std::chrono::seconds(20)));
    EXPECT_TRUE(engine.wait_all().ok());
    EXPECT_EQ(buf[0], 3.0f);
  }
}

// A backend that records what it was handed.
class Capture final : public CommBackend {
 public:
  std::string_view name() const override { return "capture"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::push_pull, Op::allreduce, Op::broadcast}, {Device::cpu, Device::cuda});
    return c;
  }
  void do_start(std::vector<PartitionView> batch, BatchDone /*sent*/, BatchDone done) override {
    {
      std::lock_guard lk(mu);
      for (auto& v : batch) seen.push_back({v.task->dtype, v.payload, v.data(), v.offset, v.bytes});
    }
    done(Status::Ok());
  }
  void shutdown() override {}
  struct Seen {
    DType dtype;
    std::byte* payload;
    std::byte* data;
    uint64_t offset, bytes;
  };
  std::mutex mu;
  std::vector<Seen> seen;
};

// Broadcasts, integer tensors and tasks that opt out go to the backend as they are: zero-copy views of the task's
// own buffer, bytes untouched, even when the engine compresses everything else.
TEST(CompressionStage, UncompressedTasksReachTheBackendUntouched) {
  auto backend = std::make_shared<Capture>();
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), backend, config({Scheme::fp16}, 1024));
  std::vector<float> b = ramp(600, 1.0f), opt = ramp(600, 2.0f), c = ramp(600, 3.0f);
  std::vector<int32_t> ints(600, 7);
  const auto b0 = b, opt0 = opt;
  Task bc = task("bcast", Op::broadcast, b);
  engine.submit(std::move(bc));
  Task t = task("opt_out", Op::allreduce, opt);
  t.compression = Spec{};
  engine.submit(std::move(t));
  Task it;
  it.name = "ints";
  it.op = Op::allreduce;
  it.dtype = DType::i32;
  it.count = ints.size();
  it.buffer.data = ints.data();
  engine.submit(std::move(it));
  ASSERT_TRUE(engine.wait_all().ok());
  {
    std::lock_guard lk(backend->mu);
    ASSERT_EQ(backend->seen.size(), 9u);
    for (auto& s : backend->seen) {
      EXPECT_EQ(s.payload, nullptr);
      EXPECT_NE(s.dtype, DType::f16);
    }
    backend->seen.clear();
  }
  EXPECT_EQ(std::memcmp(b.data(), b0.data(), b.size() * 4), 0);
  EXPECT_EQ(std::memcmp(opt.data(), opt0.data(), opt.size() * 4), 0);
  // ... while a default task of the same engine is cast: half the bytes, offsets in fp16 units, the stage's buffer.
  engine.submit(task("cast", Op::allreduce, c));
  ASSERT_TRUE(engine.wait_all().ok());
  std::lock_guard lk(backend->mu);
  ASSERT_EQ(backend->seen.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(backend->seen[i].dtype, DType::f16);
    EXPECT_NE(backend->seen[i].payload, nullptr);
    EXPECT_EQ(backend->seen[i].offset % 512, 0u);
    EXPECT_LE(backend->seen[i].bytes, 512u);
  }
}

TEST(CompressionStage, ConfigOptionParsesAndNamesTheVariable) {
  EngineConfig c;
  c.set("compression", "topk:0.05");
  EXPECT_EQ(c.compression, (Spec{Scheme::topk, 0.05}));
  try {
    c.set("compression", "gzip");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_COMPRESSION='gzip'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace commsched
