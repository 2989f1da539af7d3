// Asynchronous and stale-synchronous gradients: the StalenessGate's bound (never exceeded, whatever the arrival
// order) and the AsyncTable's running sums (every push reaches every worker exactly once).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "comm_backends/ps/async_table.h"
#include "comm_backends/ps/ps_config.h"
#include "comm_backends/ps/staleness_gate.h"
#include "comm_backends/ps/sum_kernels.h"
#include "tests/unit/ps/vec_payload.h"

using namespace commsched;
using namespace commsched::ps;
using commsched::ps::testing::bytes_of;
using commsched::ps::testing::VecPayload;

namespace {

// Workers that each push round r+1 only once round r has been answered, driven in a random order: the property an
// SSP run relies on. Checks, at every answer, that every worker has pushed round t-k, and at every moment that no
// worker has pushed more than k+1 rounds past the slowest. Returns the largest lead seen.
int64_t drive_random(uint32_t workers, uint64_t k, uint64_t rounds, uint32_t seed) {
  StalenessGate gate(workers, k);
  std::mt19937 rng(seed);
  std::vector<int64_t> pushed(workers, -1);     // the last round each pushed
  std::vector<bool> waiting(workers, false);    // pushed, not answered
  int64_t max_lead = 0;
  for (;;) {
    std::vector<uint32_t> can;
    for (uint32_t w = 0; w < workers; ++w)
      if (!waiting[w] && pushed[w] + 1 < static_cast<int64_t>(rounds)) can.push_back(w);
    if (can.empty()) break;
    const uint32_t w = can[rng() % can.size()];
    std::vector<StalenessGate::Ticket> released;
    EXPECT_EQ(gate.pushed({w, static_cast<uint64_t>(++pushed[w])}, released), "");
    waiting[w] = true;
    const int64_t slowest = *std::min_element(pushed.begin(), pushed.end());
    EXPECT_EQ(gate.slowest(), slowest);
    for (const auto& t : released) {
      EXPECT_TRUE(waiting[t.rank]);
      EXPECT_GE(slowest, static_cast<int64_t>(t.round) - static_cast<int64_t>(k))
          << "round " << t.round << " of worker " << t.rank << " answered while the slowest is at " << slowest;
      waiting[t.rank] = false;
    }
    const int64_t lead = *std::max_element(pushed.begin(), pushed.end()) - slowest;
    EXPECT_LE(lead, static_cast<int64_t>(k) + 1);
    max_lead = std::max(max_lead, lead);
  }
  for (uint32_t w = 0; w < workers; ++w) EXPECT_EQ(pushed[w] + 1, static_cast<int64_t>(rounds)) << "worker " << w << " stuck";
  EXPECT_EQ(gate.held(), 0u);
  return max_lead;
}

Header grad(uint32_t worker, uint64_t round, DType t = DType::f32, uint64_t length = 8) {
  Header h;
  h.type = MsgType::push_pull;
  h.dtype = t;
  h.flags = kFlagAsync;
  h.sender_rank = worker;
  h.key = 9;
  h.length = length;
  h.tensor_bytes = length;
  h.round = round;
  h.request_id = 100 * worker + round;
  return h;
}

std::unique_ptr<Payload> ints(int32_t a, int32_t b) { return std::make_unique<VecPayload>(bytes_of(std::vector<int32_t>{a, b})); }

std::vector<int32_t> ints_of(const Outcome& o) {
  std::vector<int32_t> v(2);
  std::memcpy(v.data(), o.data.get(), 8);
  return v;
}

}  // namespace

TEST(PsStalenessGate, TheBoundHoldsUnderRandomArrivalOrders) {
  for (uint64_t k : {0u, 1u, 2u, 5u})
    for (uint32_t workers : {1u, 2u, 3u, 7u})
      for (uint32_t seed = 0; seed < 20; ++seed) {
        const int64_t lead = drive_random(workers, k, 40, seed);
        if (::testing::Test::HasFailure()) FAIL() << "k=" << k << " workers=" << workers << " seed=" << seed;
        EXPECT_LE(lead, static_cast<int64_t>(k) + 1);
      }
}

TEST(PsStalenessGate, SomeOrderUsesTheWholeBound) {
  // Not vacuous: with k=2 a fast worker does get 3 pushes past the slowest (2 answered ahead, 1 held).
  int64_t best = 0;
  for (uint32_t seed = 0; seed < 20; ++seed) best = std::max(best, drive_random(3, 2, 40, seed));
  EXPECT_EQ(best, 3);
}

TEST(PsStalenessGate, ZeroIsSynchronousAndAsyncHoldsNothing) {
  StalenessGate sync(2, 0);
  std::vector<StalenessGate::Ticket> released;
  EXPECT_EQ(sync.pushed({0, 0}, released), "");
  EXPECT_TRUE(released.empty()) << "k=0 answered before the other worker pushed the same round";
  EXPECT_EQ(sync.pushed({1, 0}, released), "");
  EXPECT_EQ(released.size(), 2u);

  StalenessGate async(2, std::nullopt);
  released.clear();
  for (uint64_t r = 0; r < 10; ++r) EXPECT_EQ(async.pushed({0, r}, released), "");
  EXPECT_EQ(released.size(), 10u);
}

TEST(PsStalenessGate, AWorkerThatStandsAsideHoldsNobodyBack) {
  StalenessGate gate(2, 1);
  std::vector<StalenessGate::Ticket> released;
  EXPECT_EQ(gate.pushed({0, 0}, released), "");
  EXPECT_EQ(gate.pushed({0, 1}, released), "");
  EXPECT_EQ(released.size(), 1u) << "round 1 answered before worker 1 pushed round 0";
  gate.stand_aside(1, released);
  EXPECT_EQ(released.size(), 2u);
  EXPECT_NE(gate.pushed({1, 0}, released).find("after joining"), std::string::npos);
  gate.reset();
  EXPECT_EQ(gate.pushed({1, 0}, released), "");
}

TEST(PsStalenessGate, RefusesRepeatedRoundsAndBadRanks) {
  StalenessGate gate(2, 1);
  std::vector<StalenessGate::Ticket> released;
  EXPECT_EQ(gate.pushed({0, 3}, released), "");
  EXPECT_EQ(gate.pushed({0, 3}, released), "") << "another range of the same round";
  EXPECT_NE(gate.pushed({0, 2}, released).find("pushed round 2 after round 3"), std::string::npos);
  EXPECT_NE(gate.pushed({2, 0}, released).find("out of range"), std::string::npos);
}

// Each answer is the sum of every push since the asker's last answer: every push reaches every worker exactly once.
TEST(PsAsyncTable, EveryPushReachesEveryWorkerExactlyOnce) {
  Summer summer(1, 1ull << 20);
  AsyncTable table(3, std::nullopt, summer, BufferPool::create());
  std::mt19937 rng(7);
  std::vector<uint64_t> round(3, 0);
  std::vector<std::vector<int64_t>> received(3, std::vector<int64_t>(2, 0));
  int64_t pushed0 = 0, pushed1 = 0;
  for (int i = 0; i < 300; ++i) {
    const uint32_t w = rng() % 3;
    const int32_t a = static_cast<int32_t>(rng() % 1000), b = -static_cast<int32_t>(rng() % 1000);
    pushed0 += a;
    pushed1 += b;
    std::vector<Outcome> out;
    table.push(grad(w, round[w]++, DType::i32), 1, ints(a, b), out);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].error, "");
    ASSERT_EQ(out[0].waiters[0].rank, w);
    EXPECT_EQ(out[0].reply.type, MsgType::sum);
    const auto v = ints_of(out[0]);
    received[w][0] += v[0];
    received[w][1] += v[1];
  }
  // One last push of zeros each collects what is still pending.
  for (uint32_t w = 0; w < 3; ++w) {
    std::vector<Outcome> out;
    table.push(grad(w, round[w]++, DType::i32), 1, ints(0, 0), out);
    const auto v = ints_of(out.at(0));
    EXPECT_EQ(received[w][0] + v[0], pushed0) << "worker " << w;
    EXPECT_EQ(received[w][1] + v[1], pushed1) << "worker " << w;
  }
}

// Two workers, ssp with k = 0.
class PsSspTable : public ::testing::Test {
 protected:
  Summer summer{1, 1ull << 20};
  AsyncTable table{2, uint64_t{0}, summer, BufferPool::create()};
  std::vector<Outcome> out;
};

TEST_F(PsSspTable, HoldsTheAnswerAndSumsWhatArrivedMeanwhile) {
  table.push(grad(0, 0, DType::i32), 1, ints(1, 2), out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(table.held(), 1u);
  table.push(grad(1, 0, DType::i32), 2, ints(10, 20), out);
  ASSERT_EQ(out.size(), 2u);
  for (const Outcome& o : out) EXPECT_EQ(ints_of(o), (std::vector<int32_t>{11, 22}));
  EXPECT_EQ(table.held(), 0u);
}

TEST(PsAsyncTable, HalfPrecisionAccumulatesWideAndRoundsOncePerAnswer) {
  Summer summer(1, 1ull << 20);
  AsyncTable table(2, std::nullopt, summer, BufferPool::create());
  // f16 1.0 = 0x3c00, f16 2^-11 = 0x1000: 1 + 2^-11 + 2^-11 rounds to 1 + 2^-10 only when accumulated in f32.
  auto half = [](uint16_t x) { return std::make_unique<VecPayload>(bytes_of(std::vector<uint16_t>{x})); };
  std::vector<Outcome> out;
  table.push(grad(1, 0, DType::f16, 2), 1, half(0x3c00), out);
  table.push(grad(1, 1, DType::f16, 2), 1, half(0x1000), out);
  out.clear();
  table.push(grad(0, 0, DType::f16, 2), 1, half(0x1000), out);
  uint16_t v;
  std::memcpy(&v, out.at(0).data.get(), 2);
  EXPECT_EQ(v, 0x3c01);
}

TEST(PsAsyncTable, RefusesCompressionLanesAndMismatches) {
  Summer summer(1, 1ull << 20);
  AsyncTable table(2, uint64_t{1}, summer, BufferPool::create());
  std::vector<Outcome> out;
  Header topk = grad(0, 0);
  topk.codec = static_cast<uint8_t>(compression::Scheme::topk);
  table.push(topk, 1, ints(0, 0), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0].error.find("topk-compressed gradient"), std::string::npos) << out[0].error;
  EXPECT_NE(out[0].error.find("COMMSCHED_PS_MODE=sync"), std::string::npos) << out[0].error;
  out.clear();
  Header lane = grad(0, 0);
  lane.flags |= kFlagLane;
  table.push(lane, 1, ints(0, 0), out);
  EXPECT_NE(out.at(0).error.find("hierarchical lane"), std::string::npos);
  out.clear();
  table.push(grad(0, 0), 1, ints(0, 0), out);
  EXPECT_EQ(out.size(), 1u);
  out.clear();
  table.push(grad(1, 0, DType::f32, 16), 1, std::make_unique<VecPayload>(std::vector<std::byte>(16)), out);
  EXPECT_NE(out.at(0).error.find("workers disagree about the tensor"), std::string::npos) << out[0].error;
  out.clear();
  Header outside = grad(1, 0);
  outside.offset = 4;
  table.push(outside, 1, ints(0, 0), out);
  EXPECT_NE(out.at(0).error.find("not whole elements within the tensor"), std::string::npos) << out[0].error;
}

// Found reading the async path for the fuzzing work (issue 30 item 5): a push whose tensor is 2^63 f16 bytes passed
// every range check, and the whole-tensor f32 running sums it opened were sized 2 * 2^63 = 0 bytes (the pool's 4 KiB
// class): a push at offset 1 MiB summed into memory far past it. Such a tensor is refused, naming the worker.
TEST(PsAsyncTable, RefusesATensorTooLargeForItsRunningSums) {
  Summer summer(1, 1ull << 20);
  AsyncTable table(2, std::nullopt, summer, BufferPool::create());
  std::vector<Outcome> out;
  for (DType t : {DType::f16, DType::f32}) {
    Header huge = grad(1, 0, t, 4);
    huge.tensor_bytes = 1ull << 63;
    huge.offset = 1u << 20;
    table.push(huge, 1, std::make_unique<VecPayload>(std::vector<std::byte>(4)), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_NE(out[0].error.find("worker 1 pushed a gradient of a 9223372036854775808-byte"), std::string::npos)
        << out[0].error;
    out.clear();
  }
}

// Pending sums cover the whole tensor: one worker pushes it whole, the other in two halves (live tuning changes
// partition boundaries), and each answer is exactly its range of what arrived since.
TEST(PsAsyncTable, PartitionBoundariesMayChange) {
  Summer summer(1, 1ull << 20);
  AsyncTable table(2, std::nullopt, summer, BufferPool::create());
  std::vector<Outcome> out;
  table.push(grad(0, 0, DType::i32), 1, ints(1, 2), out);
  Header low = grad(1, 0, DType::i32, 4), high = grad(1, 0, DType::i32, 4);
  low.tensor_bytes = high.tensor_bytes = 8;
  high.offset = 4;
  high.request_id = 77;
  auto one = [](int32_t x) { return std::make_unique<VecPayload>(bytes_of(std::vector<int32_t>{x})); };
  table.push(low, 2, one(10), out);
  table.push(high, 2, one(20), out);
  ASSERT_EQ(out.size(), 3u);
  int32_t v;
  std::memcpy(&v, out[1].data.get(), 4);
  EXPECT_EQ(v, 11);  // worker 0's 1 and its own 10
  std::memcpy(&v, out[2].data.get(), 4);
  EXPECT_EQ(v, 22);
  out.clear();
  table.push(grad(0, 1, DType::i32), 1, ints(0, 0), out);
  EXPECT_EQ(ints_of(out.at(0)), (std::vector<int32_t>{10, 20})) << "worker 0 did not get worker 1's halves once";
}

TEST_F(PsSspTable, AJoinedWorkerReleasesTheOthers) {
  table.push(grad(0, 0, DType::i32), 1, ints(1, 1), out);
  EXPECT_TRUE(out.empty());
  table.join(1, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ints_of(out[0]), (std::vector<int32_t>{1, 1}));
  out.clear();
  table.end_joins();
  table.push(grad(1, 0, DType::i32), 1, ints(5, 5), out);
  EXPECT_TRUE(out.empty()) << "after every worker joined, worker 1's round 0 must wait for worker 0's round 0 again";
}

TEST(PsModeConfig, ValuesAreCheckedAndNamed) {
  PsConfig c;
  c.set("mode", "ssp");
  c.set("staleness", "2");
  EXPECT_EQ(PsConfig::describe_mode_word(c.mode_word()), "COMMSCHED_PS_MODE=ssp COMMSCHED_STALENESS=2");
  EXPECT_EQ(c.staleness_bound(), std::optional<uint64_t>(2));
  c.set("mode", "async");
  EXPECT_EQ(PsConfig::describe_mode_word(c.mode_word()), "COMMSCHED_PS_MODE=async");
  EXPECT_EQ(c.staleness_bound(), std::nullopt);
  try {
    c.set("mode", "bsp");
    FAIL() << "mode bsp accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_PS_MODE"), std::string::npos) << e.what();
  }
  try {
    c.set("staleness", "-1");
    FAIL() << "staleness -1 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_STALENESS"), std::string::npos) << e.what();
  }
  c.deterministic = true;
  EXPECT_THROW(c.validate(10), InvalidArgument);
  c.mode = "sync";
  EXPECT_NO_THROW(c.validate(10));
}
