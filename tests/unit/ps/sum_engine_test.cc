// The server's summation engine (SumEngine): with several shard threads, pushes summed inline or on a shard's thread,
// every answer is bitwise the one a single SlotTable / AsyncTable gives for the same arrival order (f32 with values
// whose sum depends on the order, f16 rounded once, integers exact; streaming and deterministic; async and ssp), joins
// release what they complete before join() returns, and stop() drops queued work without hanging.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "comm_backends/ps/sum_engine.h"
#include "tests/unit/ps/vec_payload.h"

using namespace commsched;
using namespace commsched::ps;
using commsched::ps::testing::VecPayload;

namespace {

struct Push {
  Header h;
  std::vector<std::byte> data;
};

// Rounds of pushes from `workers` workers to `keys` tensors of 2 partitions each, each round in a random order.
// Partitions of key k are (k % 3 == 0 ? 96 KiB : 4 KiB): some summed inline, some on a shard's thread.
std::vector<Push> random_pushes(uint32_t workers, uint64_t keys, uint64_t rounds, DType t, bool async, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Push> all;
  const size_t es = dtype_size(t);
  for (uint64_t r = 0; r < rounds; ++r) {
    std::vector<Push> round;
    for (uint64_t k = 0; k < keys; ++k) {
      const uint64_t part = k % 3 == 0 ? 96 << 10 : 4 << 10;
      for (uint64_t p = 0; p < 2; ++p)
        for (uint32_t w = 0; w < workers; ++w) {
          Push x;
          x.h.type = MsgType::push_pull;
          x.h.dtype = t;
          x.h.sender_rank = w;
          x.h.key = 1000 + k;
          x.h.offset = p * part;
          x.h.length = part;
          x.h.tensor_bytes = 2 * part;
          x.h.round = r;
          x.h.request_id = (r * keys + k) * 2 + p;
          if (async) x.h.flags |= kFlagAsync;
          x.data.resize(part);
          for (size_t i = 0; i < part / es; ++i) {
            const float f = std::ldexp(float(int(rng() % 2001) - 1000), int(rng() % 40) - 20);  // order-sensitive
            switch (t) {
              case DType::f32: std::memcpy(&x.data[i * es], &f, 4); break;
              case DType::f16: {
                const uint16_t h = kernels::f32_to_f16(float(int(rng() % 2001) - 1000) / 64);
                std::memcpy(&x.data[i * es], &h, 2);
                break;
              }
              case DType::i64: {
                const int64_t v = int64_t(rng()) - (1ll << 31);
                std::memcpy(&x.data[i * es], &v, 8);
                break;
              }
              default: ADD_FAILURE() << "dtype not generated"; return all;
            }
          }
          round.push_back(std::move(x));
        }
    }
    std::shuffle(round.begin(), round.end(), rng);
    for (auto& x : round) all.push_back(std::move(x));
  }
  return all;
}

using AnswerKey = std::tuple<uint64_t, uint64_t, uint64_t, uint32_t>;  // key, offset, request id, worker
using Answers = std::map<AnswerKey, std::vector<std::byte>>;

void collect(std::vector<Outcome>& out, Answers& into) {
  for (Outcome& o : out) {
    ASSERT_TRUE(o.error.empty()) << o.error;
    for (const Waiter& w : o.waiters) {
      const auto* d = o.data.get();
      into[{o.reply.key, o.reply.offset, w.request_id, w.rank}].assign(d, d + o.reply.length);
    }
  }
  out.clear();
}

// The single-threaded reference: one SlotTable and one AsyncTable fed in arrival order.
Answers reference(const std::vector<Push>& pushes, uint32_t workers, bool det, std::optional<uint64_t> bound) {
  Summer summer(1, 1ull << 40);
  SlotTable slots(workers, det, summer, BufferPool::create());
  AsyncTable async(workers, bound, summer, BufferPool::create());
  Answers a;
  std::vector<Outcome> out;
  for (const Push& p : pushes) {
    auto payload = std::make_unique<VecPayload>(p.data);
    if (p.h.flags & kFlagAsync) async.push(p.h, p.h.sender_rank + 1, std::move(payload), out);
    else slots.push(p.h, p.h.sender_rank + 1, std::move(payload), out);
    collect(out, a);
  }
  return a;
}

Answers through_engine(const std::vector<Push>& pushes, SumEngine::Options o) {
  Summer summer(2, 64 << 10);  // ranges of 64 KiB and more are split over two threads as well
  SumEngine engine(o, summer, BufferPool::create(), [] {});
  Answers a;
  std::vector<Outcome> out;
  for (const Push& p : pushes) {
    engine.push((p.h.flags & kFlagAsync) != 0, p.h, p.h.sender_rank + 1, std::make_unique<VecPayload>(p.data), out);
    collect(out, a);
  }
  engine.join(0);  // a barrier: every shard has taken everything pushed before it
  engine.drain(out);
  collect(out, a);
  return a;
}

}  // namespace

TEST(PsSumEngine, ShardedSumsEqualTheSingleThreadedTablesBitwise) {
  const uint32_t workers = 4;
  for (DType t : {DType::f32, DType::f16, DType::i64})
    for (bool det : {false, true}) {
      const auto pushes = random_pushes(workers, 12, 3, t, false, 7);
      const Answers want = reference(pushes, workers, det, std::nullopt);
      ASSERT_EQ(want.size(), pushes.size());  // every push answered
      for (int shards : {1, 3, 4}) {
        SumEngine::Options o{shards, workers, det, std::nullopt};
        EXPECT_TRUE(through_engine(pushes, o) == want) << dtype_name(t) << " det " << det << " shards " << shards;
        o.inline_bytes = 0;  // every push on a shard's thread
        EXPECT_TRUE(through_engine(pushes, o) == want) << dtype_name(t) << " det " << det << " shards " << shards;
      }
    }
}

TEST(PsSumEngine, AsyncAndSspAnswersEqualTheSingleThreadedTable) {
  const uint32_t workers = 3;
  for (std::optional<uint64_t> bound : {std::optional<uint64_t>{}, std::optional<uint64_t>{1}}) {
    // ssp: a round's pushes all arrive before the next round's, so no push waits beyond the bound.
    const auto pushes = random_pushes(workers, 6, 3, DType::f32, true, 11);
    const Answers want = reference(pushes, workers, false, bound);
    ASSERT_FALSE(want.empty());
    SumEngine::Options o{4, workers, false, bound};
    EXPECT_TRUE(through_engine(pushes, o) == want) << (bound ? "ssp" : "async");
  }
}

TEST(PsSumEngine, AJoinReleasesWhatItCompletesBeforeItReturns) {
  Summer summer(1, 1ull << 40);
  SumEngine engine(SumEngine::Options{4, 2, false, std::nullopt, 0}, summer, BufferPool::create(), [] {});
  std::vector<Outcome> out;
  const auto pushes = random_pushes(1, 8, 1, DType::f32, false, 3);  // worker 0's pushes only
  for (const Push& p : pushes) engine.push(false, p.h, 1, std::make_unique<VecPayload>(p.data), out);
  EXPECT_TRUE(out.empty());  // queued (inline_bytes 0), each waiting for worker 1
  EXPECT_TRUE(engine.join(1));
  EXPECT_FALSE(engine.join(1));  // said twice
  engine.drain(out);
  EXPECT_EQ(out.size(), pushes.size());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(out[i].error.empty()) << out[i].error;
    const auto& p = *std::find_if(pushes.begin(), pushes.end(), [&](const Push& x) {
      return x.h.key == out[i].reply.key && x.h.offset == out[i].reply.offset;
    });
    EXPECT_EQ(std::memcmp(out[i].data.get(), p.data.data(), p.data.size()), 0);  // the only live push is the sum
  }
  EXPECT_FALSE(engine.all_joined());
  EXPECT_TRUE(engine.join(0));
  EXPECT_TRUE(engine.all_joined());
  engine.end_joins();
  EXPECT_FALSE(engine.all_joined());
}

// Worker 1 pushes under another key what worker 0 pushes (a name counted differently): each round waits for the
// other worker. stalled() lists both, naming who pushed and who is missing; fail_stalled answers the waiting push, and
// every later push of that round, with the error.
TEST(PsSumEngine, RoundsSomeWorkersPushedAreListedAsStalledAndCanBeFailed) {
  Summer summer(1, 1ull << 40);
  SumEngine engine(SumEngine::Options{3, 3, false, std::nullopt, 0}, summer, BufferPool::create(), [] {});
  std::vector<Outcome> out;
  auto pushes = random_pushes(3, 2, 1, DType::f32, false, 9);  // keys 1000, 1001 (two partitions each), 3 workers
  for (const Push& p : pushes)
    if ((p.h.key == 1000 && p.h.sender_rank < 2) || (p.h.key == 1001 && p.h.sender_rank == 2))
      engine.push(false, p.h, p.h.sender_rank + 1, std::make_unique<VecPayload>(p.data), out);
  engine.join(7);  // a barrier (no such worker): every shard has taken the pushes
  const auto now = SlotTable::Clock::now();
  EXPECT_TRUE(engine.stalled(now, 60).empty());
  const std::vector<StalledSlot> s = engine.stalled(now + std::chrono::seconds(61), 60);
  ASSERT_EQ(s.size(), 4u);  // two partitions of each key
  for (const StalledSlot& x : s) {
    EXPECT_GE(x.waited_s, 61);
    if (x.key == 1000) {
      EXPECT_EQ(x.pushed, (std::vector<int>{0, 1}));
      EXPECT_EQ(x.missing, std::vector<int>{2});
    } else {
      EXPECT_EQ(x.pushed, std::vector<int>{2});
      EXPECT_EQ(x.missing, (std::vector<int>{0, 1}));
    }
  }
  const StalledSlot first = *std::find_if(s.begin(), s.end(), [](const StalledSlot& x) { return x.key == 1000; });
  EXPECT_NE(first.describe().find("key 1000 offset " + std::to_string(first.offset) + " round 0 waits 61"),
            std::string::npos) << first.describe();
  EXPECT_NE(first.describe().find("for worker 2 (pushed by workers 0, 1)"), std::string::npos) << first.describe();
  engine.drain(out);
  ASSERT_TRUE(out.empty());
  engine.fail_stalled(first, "stalled", out);
  ASSERT_EQ(out.size(), 1u);  // one answer for the round's two waiting pushes
  EXPECT_EQ(out[0].error, "stalled");
  EXPECT_EQ(out[0].waiters.size(), 2u);
  EXPECT_EQ(engine.stalled(now + std::chrono::seconds(61), 60).size(), 3u);  // failed rounds are not listed again
  out.clear();
  const Push& late = *std::find_if(pushes.begin(), pushes.end(), [&](const Push& p) {
    return p.h.key == 1000 && p.h.offset == first.offset && p.h.sender_rank == 2;
  });
  engine.push(false, late.h, 3, std::make_unique<VecPayload>(late.data), out);
  engine.join(7);
  engine.drain(out);
  ASSERT_EQ(out.size(), 1u);  // the missing worker's late push learns the error too
  EXPECT_EQ(out[0].error, "stalled");
}

TEST(PsSumEngine, StopDropsQueuedWorkAndTheReadyCallbackWakesTheOwner) {
  Summer summer(1, 1ull << 40);
  std::atomic<int> ready{0};
  {
    // Two workers: a sole worker's pushes need no summing and never queue (ASoleWorkersBigPush... below).
    SumEngine engine(SumEngine::Options{2, 2, false, std::nullopt, 0}, summer, BufferPool::create(), [&] { ++ready; });
    std::vector<Outcome> out;
    const auto pushes = random_pushes(2, 30, 4, DType::f32, false, 5);
    for (const Push& p : pushes) engine.push(false, p.h, 1, std::make_unique<VecPayload>(p.data), out);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (ready.load() == 0 && std::chrono::steady_clock::now() < end) std::this_thread::yield();
    EXPECT_GT(ready.load(), 0) << "answers summed on a shard's thread must wake the owner";
    engine.stop();
    engine.stop();  // idempotent
    engine.drain(out);
    EXPECT_GT(out.size(), 0u);
    EXPECT_LE(out.size(), pushes.size() / 2);  // what ran before the stop (a sum per two pushes); the rest was dropped
  }
}

// A sole worker's push needs no summing: at any size it is answered at once, on the caller's thread, with the pushed
// bytes themselves (no copy), even when the inline size would send it to a shard.
TEST(PsSumEngine, ASoleWorkersBigPushIsAnsweredAtOnceWithItself) {
  Summer summer(1, 1ull << 40);
  SumEngine engine(SumEngine::Options{2, 1, false, std::nullopt, 0}, summer, BufferPool::create(), [] {});
  const auto pushes = random_pushes(1, 3, 2, DType::f32, false, 5);  // 96 KiB and 4 KiB partitions
  for (const Push& p : pushes) {
    std::vector<Outcome> out;
    auto payload = std::make_unique<VecPayload>(p.data);
    const std::byte* pushed = payload->bytes().data();
    engine.push(false, p.h, 1, std::move(payload), out);
    ASSERT_EQ(out.size(), 1u) << "key " << p.h.key << " offset " << p.h.offset;
    ASSERT_TRUE(out[0].error.empty()) << out[0].error;
    EXPECT_EQ(out[0].data.get(), pushed);
    EXPECT_EQ(std::memcmp(out[0].data.get(), p.data.data(), p.data.size()), 0);
  }
}
