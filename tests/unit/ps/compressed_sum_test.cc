// The server's sums of compressed pushes (top-k, signSGD): decoded, summed, encoded again in the same scheme and
// size, with the server's error feedback; deterministic mode independent of arrival order; malformed or mismatched
// pushes answered with an error that names the worker, never a hang.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "comm_backends/ps/slot_table.h"
#include "comm_backends/ps/sum_kernels.h"
#include "compression/codec.h"
#include "tests/unit/ps/vec_payload.h"

using namespace commsched;
using namespace commsched::ps;
namespace cz = commsched::compression;
using commsched::ps::testing::VecPayload;

namespace {

constexpr uint64_t kN = 1000;
constexpr uint32_t kWorkers = 3;

std::vector<float> gradient(uint32_t worker, uint64_t round) {
  std::mt19937 rng(static_cast<uint32_t>(worker * 7919 + round));
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> g(kN);
  for (auto& v : g) v = d(rng);
  return g;
}

std::vector<std::byte> encoded(const cz::Spec& s, const std::vector<float>& g) {
  std::vector<std::byte> w(cz::encoded_bytes(s, DType::f32, g.size()));
  cz::encode(s, DType::f32, g.data(), g.size(), nullptr, w.data());
  return w;
}

std::vector<float> decoded(const cz::Spec& s, const std::byte* wire, uint64_t n = kN) {
  std::vector<float> out(n);
  cz::decode(s, DType::f32, wire, n, out.data());
  return out;
}

Header push_header(const cz::Spec& s, uint32_t worker, uint64_t round, uint64_t wire_bytes) {
  Header h;
  h.type = MsgType::push_pull;
  h.dtype = DType::f32;
  h.sender_rank = worker;
  h.key = 5;
  h.offset = 0;
  h.length = wire_bytes;
  h.tensor_bytes = kN * 4;
  h.round = round;
  h.request_id = round * 10 + worker;
  h.codec = static_cast<uint8_t>(s.scheme);
  h.elements = static_cast<uint32_t>(kN);
  return h;
}

// Pushes every worker's wire (in `order`) for one round; returns the single answer.
Outcome round_trip(SlotTable& t, const cz::Spec& s, uint64_t round, const std::vector<std::vector<std::byte>>& wires,
                   std::vector<uint32_t> order = {0, 1, 2}) {
  std::vector<Outcome> out;
  for (uint32_t w : order)
    t.push(push_header(s, w, round, wires[w].size()), w + 1, std::make_unique<VecPayload>(wires[w]), out);
  EXPECT_EQ(out.size(), 1u);
  return out.empty() ? Outcome{} : std::move(out[0]);
}

TEST(PsCompressedSum, TopkAnswerIsTopkOfTheSumAndErrorFeedbackLosesNothing) {
  const cz::Spec s{cz::Scheme::topk, 0.05};
  Summer summer(1, 1ull << 20);
  SlotTable table(kWorkers, /*deterministic=*/false, summer, BufferPool::create());
  std::vector<std::vector<std::byte>> wires;
  std::vector<float> sum(kN, 0.f);  // what the server must account for: the decoded pushes, in arrival order
  for (uint32_t w = 0; w < kWorkers; ++w) {
    wires.push_back(encoded(s, gradient(w, 0)));
    const auto d = decoded(s, wires.back().data());
    for (uint64_t i = 0; i < kN; ++i) sum[i] += d[i];
  }
  Outcome o = round_trip(table, s, 0, wires);
  ASSERT_TRUE(o.error.empty()) << o.error;
  EXPECT_EQ(o.waiters.size(), kWorkers);
  ASSERT_EQ(o.reply.length, wires[0].size());  // the same size as a push: every worker decodes it with its own spec
  const auto first = decoded(s, o.data.get());
  // The answer is the 50 largest elements of the sum, exactly.
  std::vector<float> mags(kN);
  for (uint64_t i = 0; i < kN; ++i) mags[i] = std::abs(sum[i]);
  std::vector<float> sorted = mags;
  std::nth_element(sorted.begin(), sorted.begin() + 49, sorted.end(), std::greater<>());
  size_t sent = 0;
  for (uint64_t i = 0; i < kN; ++i) {
    if (first[i] == 0.f) continue;
    ++sent;
    EXPECT_EQ(first[i], sum[i]) << i;
    EXPECT_GE(mags[i], sorted[49]) << i;
  }
  EXPECT_EQ(sent, 50u);
  // Zero pushes from then on: the server's residual drains 50 elements a round, so after 20 rounds everything the
  // workers sent has reached them exactly once.
  std::vector<float> total = first;
  for (uint64_t round = 1; round < 20; ++round) {
    const std::vector<std::vector<std::byte>> zeros(kWorkers, encoded(s, std::vector<float>(kN, 0.f)));
    Outcome z = round_trip(table, s, round, zeros);
    ASSERT_TRUE(z.error.empty()) << z.error;
    const auto d = decoded(s, z.data.get());
    for (uint64_t i = 0; i < kN; ++i) total[i] += d[i];
  }
  EXPECT_EQ(total, sum);
}

TEST(PsCompressedSum, SignsgdAnswerIsTheScaledSignOfTheSum) {
  const cz::Spec s{cz::Scheme::signsgd, 0.01};
  Summer summer(1, 1ull << 20);
  SlotTable table(kWorkers, false, summer, BufferPool::create());
  std::vector<std::vector<std::byte>> wires;
  std::vector<double> sum(kN, 0.0);
  for (uint32_t w = 0; w < kWorkers; ++w) {
    wires.push_back(encoded(s, gradient(w, 0)));
    const auto d = decoded(s, wires.back().data());
    for (uint64_t i = 0; i < kN; ++i) sum[i] += d[i];
  }
  double l1 = 0;
  for (double v : sum) l1 += std::abs(v);
  const float scale = static_cast<float>(l1 / kN);
  Outcome o = round_trip(table, s, 0, wires);
  ASSERT_TRUE(o.error.empty()) << o.error;
  ASSERT_EQ(o.reply.length, wires[0].size());
  const auto d = decoded(s, o.data.get());
  for (uint64_t i = 0; i < kN; ++i) {
    EXPECT_FLOAT_EQ(std::abs(d[i]), scale) << i;
    EXPECT_EQ(d[i] >= 0, sum[i] >= 0) << i;  // the majority (weighted by each worker's scale) wins
  }
}

TEST(PsCompressedSum, DeterministicModeDoesNotDependOnArrivalOrder) {
  for (const cz::Spec s : {cz::Spec{cz::Scheme::topk, 0.1}, cz::Spec{cz::Scheme::signsgd, 0.01}}) {
    Summer summer(1, 1ull << 20);
    SlotTable a(kWorkers, /*deterministic=*/true, summer, BufferPool::create());
    SlotTable b(kWorkers, /*deterministic=*/true, summer, BufferPool::create());
    for (uint64_t round = 0; round < 3; ++round) {
      std::vector<std::vector<std::byte>> wires;
      for (uint32_t w = 0; w < kWorkers; ++w) wires.push_back(encoded(s, gradient(w, round)));
      Outcome x = round_trip(a, s, round, wires, {0, 1, 2});
      Outcome y = round_trip(b, s, round, wires, {2, 0, 1});
      ASSERT_TRUE(x.error.empty() && y.error.empty()) << x.error << y.error;
      EXPECT_EQ(std::memcmp(x.data.get(), y.data.get(), x.reply.length), 0)
          << cz::scheme_name(s.scheme) << " round " << round;
    }
  }
}

TEST(PsCompressedSum, MalformedPushesAreAnsweredWithAnErrorNamingTheWorker) {
  const cz::Spec s{cz::Scheme::topk, 0.05};
  Summer summer(1, 1ull << 20);
  for (const bool deterministic : {false, true}) {
    SlotTable table(kWorkers, deterministic, summer, BufferPool::create());
    std::vector<std::vector<std::byte>> wires;
    for (uint32_t w = 0; w < kWorkers; ++w) wires.push_back(encoded(s, gradient(w, 0)));
    const uint32_t too_far = kN + 7;  // worker 2 names an element outside the range
    std::memcpy(wires[2].data(), &too_far, sizeof too_far);
    Outcome o = round_trip(table, s, 0, wires);
    EXPECT_EQ(o.waiters.size(), kWorkers) << "every waiting worker gets the answer";
    EXPECT_NE(o.error.find("worker 2"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("element 1007 of 1000"), std::string::npos) << o.error;
    EXPECT_EQ(table.open_slots(), 0u);
    // A size that is not index/value pairs: refused from the first push on.
    std::vector<Outcome> out;
    for (uint32_t w = 0; w < kWorkers; ++w)
      table.push(push_header(s, w, 1, 13), w + 1, std::make_unique<VecPayload>(std::vector<std::byte>(13)), out);
    ASSERT_FALSE(out.empty());
    size_t answered = 0;
    for (auto& e : out) {
      EXPECT_NE(e.error.find("malformed compressed push"), std::string::npos) << e.error;
      answered += e.waiters.size();
    }
    EXPECT_EQ(answered, kWorkers);
  }
}

TEST(PsCompressedSum, WorkersDisagreeingAboutTheSchemeAreNamed) {
  Summer summer(1, 1ull << 20);
  SlotTable table(2, false, summer, BufferPool::create());
  const cz::Spec topk{cz::Scheme::topk, 0.05}, sign{cz::Scheme::signsgd, 0.01};
  const auto a = encoded(topk, gradient(0, 0));
  const auto b = encoded(sign, gradient(1, 0));
  std::vector<Outcome> out;
  table.push(push_header(topk, 0, 0, a.size()), 1, std::make_unique<VecPayload>(a), out);
  table.push(push_header(sign, 1, 0, b.size()), 2, std::make_unique<VecPayload>(b), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiters.size(), 2u);
  EXPECT_NE(out[0].error.find("topk of 1000 elements"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("signsgd of 1000 elements"), std::string::npos) << out[0].error;
}

}  // namespace
