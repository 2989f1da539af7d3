// Server summation kernels, the buffer pool and the slot table (without sockets).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "comm_backends/ps/slot_table.h"
#include "comm_backends/ps/sum_kernels.h"
#include "tests/unit/ps/vec_payload.h"

using namespace commsched;
using namespace commsched::ps;
using commsched::ps::testing::bytes_of;
using commsched::ps::testing::VecPayload;

namespace {


}  // namespace

TEST(PsKernels, HalfConversionsMatchReference) {
  // Every f16 value round-trips through f32 exactly; f32 -> f16 rounds to nearest even.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = kernels::f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(kernels::f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(kernels::f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(kernels::f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(kernels::f32_to_f16(70000.f), 0x7c00);             // overflow -> inf
  EXPECT_EQ(kernels::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(kernels::bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(kernels::f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(kernels::f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
}

// Half types accumulate in f32 and round once: 2048 + 1 + 1 is 2050 (representable in f16), while adding in f16
// steps would round 2048 + 1 back to 2048 twice. Same for bf16 with 256.
TEST(PsKernels, HalfAccumulatesInF32) {
  for (DType t : {DType::f16, DType::bf16}) {
    auto enc = [&](float f) { return t == DType::f16 ? kernels::f32_to_f16(f) : kernels::f32_to_bf16(f); };
    auto dec = [&](uint16_t h) { return t == DType::f16 ? kernels::f16_to_f32(h) : kernels::bf16_to_f32(h); };
    const size_t n = 1000;  // not a multiple of 8: exercises the tails
    std::vector<uint16_t> a(n, enc(t == DType::f16 ? 2048.f : 256.f)), one(n, enc(1.f)), out(n);
    std::vector<float> acc(n);
    kernels::add2(t, acc.data(), a.data(), one.data(), n);
    kernels::add(t, acc.data(), one.data(), n);
    kernels::narrow(t, out.data(), acc.data(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(dec(out[i]), t == DType::f16 ? 2050.f : 258.f) << i;
  }
}

TEST(PsKernels, EveryDtypeSumsAndRankedOrderIsFixed) {
  std::mt19937 rng(3);
  for (int ti = 0; ti < kNumDTypes; ++ti) {
    const DType t = static_cast<DType>(ti);
    const size_t n = 5000, es = dtype_size(t);
    std::vector<std::vector<std::byte>> in(4, std::vector<std::byte>(n * es));
    for (auto& v : in)
      for (size_t i = 0; i < n; ++i) {
        const int x = static_cast<int>(rng() % 17) - 8;
        switch (t) {
          case DType::f32: { float f = x; std::memcpy(&v[i * es], &f, 4); break; }
          case DType::f64: { double f = x; std::memcpy(&v[i * es], &f, 8); break; }
          case DType::f16: { uint16_t h = kernels::f32_to_f16(x); std::memcpy(&v[i * es], &h, 2); break; }
          case DType::bf16: { uint16_t h = kernels::f32_to_bf16(x); std::memcpy(&v[i * es], &h, 2); break; }
          case DType::i32: { int32_t f = x; std::memcpy(&v[i * es], &f, 4); break; }
          case DType::i64: { int64_t f = x; std::memcpy(&v[i * es], &f, 8); break; }
        }
      }
    std::vector<std::byte> ranked(n * es), streamed(n * es), acc(n * accumulator_size(t));
    const void* srcs[] = {in[0].data(), in[1].data(), in[2].data(), in[3].data()};
    kernels::sum_ranked(t, ranked.data(), srcs, n);
    kernels::add2(t, acc.data(), in[2].data(), in[0].data(), n);
    kernels::add(t, acc.data(), in[3].data(), n);
    kernels::add(t, acc.data(), in[1].data(), n);
    kernels::narrow(t, streamed.data(), acc.data(), n);
    EXPECT_EQ(ranked, streamed) << dtype_name(t);  // integer data: order does not matter, sums are exact
  }
}

TEST(PsKernels, ParallelSummerMatchesSerial) {
  Summer par(2, 64 * 1024), ser(1, 1ull << 40);
  const size_t n = 3'000'001;
  std::vector<float> a(n), b(n), x(n), y(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i % 1000) * 0.25f, b[i] = 1.5f;
  par.add2(DType::f32, x.data(), a.data(), b.data(), n);
  ser.add2(DType::f32, y.data(), a.data(), b.data(), n);
  EXPECT_EQ(x, y);
}

// The server's shard threads share one Summer: concurrent callers each get their own range summed, with every chunk
// of every call done exactly once (sizes chosen so chunks of different calls interleave in the helpers' queue).
TEST(PsKernels, ConcurrentCallersShareTheHelpers) {
  Summer par(3, 64 * 1024);
  const size_t sizes[] = {100'003, 250'000, 1'000'000, 70'000};
  std::vector<std::vector<float>> acc(4), add(4);
  for (int c = 0; c < 4; ++c) {
    acc[c].assign(sizes[c], 1.0f);
    add[c].resize(sizes[c]);
    for (size_t i = 0; i < sizes[c]; ++i) add[c][i] = static_cast<float>((i + c) % 7);
  }
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int r = 0; r < 5; ++r) par.add(DType::f32, acc[c].data(), add[c].data(), sizes[c]);
    });
  for (auto& t : callers) t.join();
  for (int c = 0; c < 4; ++c)
    for (size_t i = 0; i < sizes[c]; ++i)
      ASSERT_EQ(acc[c][i], 1.0f + 5.0f * static_cast<float>((i + c) % 7)) << "caller " << c << " element " << i;
}

TEST(PsSlotTable, SumsAnswerEveryWorkerAndReusesMemory) {
  Summer summer(1, 1ull << 20);
  auto pool = BufferPool::create();
  SlotTable table(3, /*deterministic=*/false, summer, pool);
  std::vector<Outcome> out;
  uint64_t steady = 0;
  for (uint64_t round = 0; round < 1000; ++round) {
    // Partition boundaries change every round: 2 or 3 partitions of a 6000-float tensor.
    const uint64_t parts = round % 2 ? 2 : 3, per = 6000 / parts;
    for (uint64_t p = 0; p < parts; ++p)
      for (uint32_t w = 0; w < 3; ++w) {
        Header h;
        h.type = MsgType::push_pull;
        h.dtype = DType::f32;
        h.sender_rank = w;
        h.key = 77;
        h.offset = p * per * 4;
        h.length = per * 4;
        h.tensor_bytes = 6000 * 4;
        h.round = round;
        h.request_id = round * 10 + w;
        table.push(h, w + 1, std::make_unique<VecPayload>(bytes_of(std::vector<float>(per, float(w + 1)))), out);
      }
    ASSERT_EQ(out.size(), parts);
    for (auto& o : out) {
      ASSERT_TRUE(o.error.empty()) << o.error;
      ASSERT_EQ(o.waiters.size(), 3u);
      const float* s = reinterpret_cast<const float*>(o.data.get());
      EXPECT_EQ(s[0], 6.f);
      EXPECT_EQ(s[o.reply.length / 4 - 1], 6.f);
    }
    out.clear();  // answers sent: buffers return to the pool
    EXPECT_EQ(table.open_slots(), 0u);
    if (round == 10) steady = pool->allocated_bytes();
  }
  EXPECT_GT(steady, 0u);
  EXPECT_EQ(pool->allocated_bytes(), steady);  // no growth over 1000 rounds
}

TEST(PsSlotTable, MismatchedSizesNameKeyAndSizes) {
  Summer summer(1, 1ull << 20);
  SlotTable table(2, false, summer, BufferPool::create());
  std::vector<Outcome> out;
  Header h;
  h.type = MsgType::push_pull;
  h.key = 99;
  h.length = h.tensor_bytes = 400;
  table.push(h, 1, std::make_unique<VecPayload>(std::vector<std::byte>(400)), out);
  h.sender_rank = 1;
  h.length = h.tensor_bytes = 800;
  h.dtype = DType::f64;
  table.push(h, 2, std::make_unique<VecPayload>(std::vector<std::byte>(800)), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiters.size(), 2u);
  EXPECT_NE(out[0].error.find("key 99"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("400 bytes"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("800 bytes"), std::string::npos) << out[0].error;
  EXPECT_EQ(table.open_slots(), 0u);
}

TEST(PsSlotTable, DeterministicModeSumsInRankOrder) {
  Summer summer(1, 1ull << 20);
  // Values whose f32 sum depends on the order: (1e8 + 1) - 1e8 ... arrival order 2,0,1 must not matter.
  const std::vector<float> v[3] = {{1e8f}, {1.f}, {-1e8f}};
  for (bool det : {true, false}) {
    SlotTable table(3, det, summer, BufferPool::create());
    std::vector<Outcome> out;
    for (uint32_t w : {2u, 0u, 1u}) {
      Header h;
      h.type = MsgType::push_pull;
      h.sender_rank = w;
      h.length = h.tensor_bytes = 4;
      table.push(h, w + 1, std::make_unique<VecPayload>(bytes_of(v[w])), out);
    }
    ASSERT_EQ(out.size(), 1u);
    float s;
    std::memcpy(&s, out[0].data.get(), 4);
    if (det) EXPECT_EQ(s, (1e8f + 1.f) + -1e8f);  // rank order
    else EXPECT_EQ(s, (-1e8f + 1e8f) + 1.f);      // arrival order
  }
}

Header push_of(uint32_t worker, uint64_t key, uint64_t round, uint64_t bytes, DType dtype = DType::f32) {
  Header h;
  h.type = MsgType::push_pull;
  h.dtype = dtype;
  h.sender_rank = worker;
  h.key = key;
  h.length = h.tensor_bytes = bytes;
  h.round = round;
  h.request_id = key * 100 + worker;
  return h;
}

// Horovod's join: a joined worker stands in with zeros, for a slot already open (answered as soon as it joins) and
// for slots opened later (answered with the last live push); in streaming and deterministic mode, f32 and f16 (a
// single live push is answered as it is, without the f32 accumulator); end_joins() makes slots wait for all again.
TEST(PsSlotTable, JoinedWorkersStandInWithZerosUntilEveryoneJoined) {
  Summer summer(1, 1ull << 20);
  for (bool det : {false, true}) {
    SlotTable table(3, det, summer, BufferPool::create());
    std::vector<Outcome> out;
    table.push(push_of(0, 1, 0, 8), 1, std::make_unique<VecPayload>(bytes_of(std::vector<float>{1, 2})), out);
    table.push(push_of(1, 1, 0, 8), 2, std::make_unique<VecPayload>(bytes_of(std::vector<float>{10, 20})), out);
    EXPECT_TRUE(out.empty());
    table.join(2, out);  // worker 2 will never push key 1 round 0: the slot is complete now
    ASSERT_EQ(out.size(), 1u) << det;
    ASSERT_TRUE(out[0].error.empty()) << out[0].error;
    EXPECT_EQ(out[0].waiters.size(), 2u);
    const float* sum = reinterpret_cast<const float*>(out[0].data.get());
    EXPECT_EQ(sum[0], 11.f);
    EXPECT_EQ(sum[1], 22.f);
    out.clear();
    table.join(1, out);
    EXPECT_TRUE(out.empty());
    const std::vector<uint16_t> half{0x3c00, 0x4000};  // 1.0, 2.0 in f16
    table.push(push_of(0, 2, 0, 4, DType::f16), 1, std::make_unique<VecPayload>(bytes_of(half)), out);
    ASSERT_EQ(out.size(), 1u) << det;  // the only live worker's push is the sum
    ASSERT_TRUE(out[0].error.empty()) << out[0].error;
    EXPECT_EQ(std::memcmp(out[0].data.get(), half.data(), 4), 0);
    out.clear();
    // A joined worker pushing again is told what went wrong.
    table.push(push_of(1, 3, 0, 8), 2, std::make_unique<VecPayload>(std::vector<std::byte>(8)), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_NE(out[0].error.find("after joining"), std::string::npos) << out[0].error;
    out.clear();
    table.end_joins();
    table.push(push_of(0, 4, 1, 8), 1, std::make_unique<VecPayload>(std::vector<std::byte>(8)), out);
    table.push(push_of(1, 4, 1, 8), 2, std::make_unique<VecPayload>(std::vector<std::byte>(8)), out);
    EXPECT_TRUE(out.empty());  // waits for worker 2 again
    EXPECT_EQ(table.open_slots(), 1u);
  }
}

// One kernel set for every backend: the pairwise sum Gloo's reduction and the loopback backend call rounds exactly as
// the server's accumulator kernels do (f32 sum, round to nearest even), in place too, for every element value pair
// class (normals, subnormals, ties, overflow, NaN) and across the vector/tail boundary.
TEST(PsKernels, PairwiseSumOfEveryBackendRoundsLikeTheServer) {
  std::mt19937 rng(11);
  for (DType t : {DType::f16, DType::bf16}) {
    const size_t n = 4099;  // more than one scratch block, and a tail
    std::vector<uint16_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<uint16_t>(rng());
      b[i] = static_cast<uint16_t>(rng());
    }
    std::vector<float> acc(n);
    std::vector<uint16_t> want(n), got(n), in_place = a;
    kernels::add2(t, acc.data(), a.data(), b.data(), n);
    kernels::narrow(t, want.data(), acc.data(), n);
    kernels::sum_pair(t, got.data(), a.data(), b.data(), n);
    sum_into(t, in_place.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const bool f16 = t == DType::f16;
      const float x = f16 ? kernels::f16_to_f32(a[i]) : kernels::bf16_to_f32(a[i]);
      const float y = f16 ? kernels::f16_to_f32(b[i]) : kernels::bf16_to_f32(b[i]);
      const uint16_t ref = f16 ? kernels::f32_to_f16(x + y) : kernels::f32_to_bf16(x + y);
      if (std::isnan(x + y)) {
        const float w = f16 ? kernels::f16_to_f32(got[i]) : kernels::bf16_to_f32(got[i]);
        EXPECT_TRUE(std::isnan(w)) << dtype_name(t) << " element " << i;
      } else {
        EXPECT_EQ(got[i], ref) << dtype_name(t) << " element " << i << std::hex << ": " << a[i] << " + " << b[i];
      }
      EXPECT_EQ(got[i], want[i]) << dtype_name(t) << " element " << i;
      EXPECT_EQ(in_place[i], got[i]) << dtype_name(t) << " element " << i << " (in place)";
    }
  }
  std::vector<int64_t> x{1, -2, 1ll << 40}, y{5, 7, 1};
  sum_into(DType::i64, x.data(), y.data(), x.size());
  EXPECT_EQ(x, (std::vector<int64_t>{6, 5, (1ll << 40) + 1}));
}
