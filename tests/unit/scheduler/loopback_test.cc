#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "comm_backends/loopback/loopback_backend.h"
#include "comm_backends/reduce.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

// Fills a buffer of `dtype` with small integers (exact in every dtype) derived from rank and index.
std::vector<std::byte> make_data(DType dtype, size_t n, int rank) {
  std::vector<std::byte> out(n * dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) {
    const int v = static_cast<int>((i * 31 + static_cast<size_t>(rank) * 7) % 17) - 8;
    switch (dtype) {
      case DType::f32: { float x = static_cast<float>(v); std::memcpy(&out[i * 4], &x, 4); break; }
      case DType::f64: { double x = v; std::memcpy(&out[i * 8], &x, 8); break; }
      case DType::i32: { int32_t x = v; std::memcpy(&out[i * 4], &x, 4); break; }
      case DType::i64: { int64_t x = v; std::memcpy(&out[i * 8], &x, 8); break; }
      case DType::f16: { uint16_t x = f32_to_f16(static_cast<float>(v)); std::memcpy(&out[i * 2], &x, 2); break; }
      case DType::bf16: { uint16_t x = f32_to_bf16(static_cast<float>(v)); std::memcpy(&out[i * 2], &x, 2); break; }
    }
  }
  return out;
}

double element(DType dtype, const std::vector<std::byte>& b, size_t i) {
  switch (dtype) {
    case DType::f32: { float x; std::memcpy(&x, &b[i * 4], 4); return x; }
    case DType::f64: { double x; std::memcpy(&x, &b[i * 8], 8); return x; }
    case DType::i32: { int32_t x; std::memcpy(&x, &b[i * 4], 4); return x; }
    case DType::i64: { int64_t x; std::memcpy(&x, &b[i * 8], 8); return static_cast<double>(x); }
    case DType::f16: { uint16_t x; std::memcpy(&x, &b[i * 2], 2); return f16_to_f32(x); }
    case DType::bf16: { uint16_t x; std::memcpy(&x, &b[i * 2], 2); return bf16_to_f32(x); }
  }
  return 0;
}

class LoopbackSum : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(LoopbackSum, EveryRankGetsTheExactSum) {
  const auto [ranks, dtype] = GetParam();
  auto backends = make_loopback_group(ranks, LinkModel{20e9, 5e-6});
  const std::vector<size_t> sizes = {0, 1, 3, 1000, 4099, 70000};
  std::vector<std::vector<std::vector<std::byte>>> data(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    for (size_t s : sizes) data[r].push_back(make_data(dtype, s, r));
    threads.emplace_back([&, r] {
      EngineConfig cfg;
      cfg.knobs = Knobs{4096, 16384};
      Engine engine(std::make_unique<PriorityCreditPolicy>(16384), backends[r], cfg);
      // Ranks submit in different orders: the backend matches partitions by key, not by arrival.
      for (size_t k = 0; k < sizes.size(); ++k) {
        const size_t i = (r % 2 == 0) ? k : sizes.size() - 1 - k;
        Task t;
        t.name = "tensor" + std::to_string(i);
        t.priority = static_cast<int>(i);
        t.op = Op::allreduce;
        t.dtype = dtype;
        t.count = sizes[i];
        t.buffer.data = data[r][i].data();
        t.on_done = [](const Status& s) { ASSERT_TRUE(s.ok()) << s.message; };
        engine.submit(std::move(t));
      }
      engine.wait_all();
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<std::vector<std::byte>> inputs;
    for (int r = 0; r < ranks; ++r) inputs.push_back(make_data(dtype, sizes[i], r));
    for (size_t e = 0; e < sizes[i]; ++e) {
      double expect = 0;
      for (int r = 0; r < ranks; ++r) expect += element(dtype, inputs[r], e);
      for (int r = 0; r < ranks; ++r)
        ASSERT_EQ(element(dtype, data[r][i], e), expect) << "rank " << r << " tensor " << i << " element " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RanksByDtype, LoopbackSum,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32,
                                                              DType::i64)));

TEST(Loopback, BroadcastCopiesRoot) {
  auto backends = make_loopback_group(3);
  std::vector<std::vector<int32_t>> bufs(3, std::vector<int32_t>(5000));
  for (int r = 0; r < 3; ++r) std::fill(bufs[r].begin(), bufs[r].end(), r * 100);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      Engine engine(std::make_unique<PriorityCreditPolicy>(0), backends[r], EngineConfig{});
      Task t;
      t.name = "params";
      t.op = Op::broadcast;
      t.dtype = DType::i32;
      t.count = bufs[r].size();
      t.buffer.data = bufs[r].data();
      t.root = 2;
      engine.submit(std::move(t));
      engine.wait_all();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(bufs[r][4999], 200) << "rank " << r;
}

TEST(Loopback, MismatchedSizesNameTheTask) {
  auto backends = make_loopback_group(2);
  std::vector<float> a(100), b(101);
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      EngineConfig cfg;
      cfg.knobs.partition_bytes = 1 << 20;
      Engine engine(std::make_unique<PriorityCreditPolicy>(0), backends[r], cfg);
      Task t;
      t.name = "fc.weight";
      t.op = Op::allreduce;
      t.count = r == 0 ? a.size() : b.size();
      t.buffer.data = r == 0 ? a.data() : b.data();
      t.on_done = [&, r](const Status& s) { results[r] = s; };
      engine.submit(std::move(t));
      engine.wait_all();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(results[r].ok());
    EXPECT_NE(results[r].message.find("fc.weight"), std::string::npos) << results[r].message;
    EXPECT_NE(results[r].message.find("100"), std::string::npos) << results[r].message;
    EXPECT_NE(results[r].message.find("101"), std::string::npos) << results[r].message;
  }
}

TEST(Loopback, PeerShutdownFailsWaitingRanksInsteadOfHanging) {
  auto backends = make_loopback_group(2);
  std::vector<float> a(100);
  Status result;
  {
    Engine engine(std::make_unique<PriorityCreditPolicy>(0), backends[0], EngineConfig{});
    Task t;
    t.name = "w";
    t.op = Op::allreduce;
    t.count = a.size();
    t.buffer.data = a.data();
    t.on_done = [&](const Status& s) { result = s; };
    engine.submit(std::move(t));
    backends[1]->shutdown();  // rank 1 leaves without ever contributing
    ASSERT_TRUE(engine.wait_all_for(std::chrono::seconds(5)));
  }
  EXPECT_EQ(result.code, Status::Code::peer_lost);
  EXPECT_NE(result.message.find("rank 1"), std::string::npos) << result.message;
}

TEST(Reduce, HalfConversionsRoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1000.0f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 4096)), 1.0f) << "ties round to even";
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  for (float v : {0.0f, 1.0f, -3.0f, 256.0f, 0x1.8p60f}) EXPECT_EQ(bf16_to_f32(f32_to_bf16(v)), v) << v;
}

}  // namespace
}  // namespace commsched
