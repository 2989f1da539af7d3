// The engine's stage chain and its behaviour under injected failures: an exception in the policy, the backend, a
// callback or a stage fails the affected tasks with a message naming the cause, and wait_all never hangs.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "tests/unit/scheduler/test_backends.h"

namespace commsched {
namespace {

using testing::config_with;
using testing::make_task;
using testing::RecordingBackend;
using testing::ThrowingBackend;
using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Waits (bounded) for every task; the test fails instead of hanging.
Status wait_bounded(Engine& e) {
  if (!e.wait_all_for(20s)) {
    ADD_FAILURE() << "wait_all hung";
    return Status::Error("hung");
  }
  return e.wait_all();
}

// ---------------------------------------------------------------- stages overlap

// A stage that holds each partition until `want` partitions are inside it at once (or a deadline passes), and
// records the most it ever saw together.
class GatheringStage final : public Stage {
 public:
  explicit GatheringStage(int want) : want_(want) {}
  std::string_view name() const override { return "gathering"; }
  bool applies(const TaskDesc&) const override { return true; }
  void encode(const PartitionView&, PartitionView&, std::unique_ptr<StageState>&) override {
    std::unique_lock lk(mu_);
    ++inside_;
    max_inside_ = std::max(max_inside_, inside_);
    cv_.notify_all();
    cv_.wait_for(lk, 10s, [&] { return max_inside_ >= want_; });
    --inside_;
  }
  void decode(const PartitionView&, const PartitionView&, std::unique_ptr<StageState>&) override { ++decoded; }
  int max_inside() {
    std::lock_guard lk(mu_);
    return max_inside_;
  }
  std::atomic<int> decoded{0};

 private:
  const int want_;
  std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0, max_inside_ = 0;
};

TEST(EngineStages, StagesOfDifferentPartitionsOverlap) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs for two partitions to be encoded at once";
  auto stage = std::make_shared<GatheringStage>(2);
  auto backend = std::make_shared<RecordingBackend>();
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), backend, config_with(1024, 0), {stage});
  std::vector<float> buf(4 * 256);  // four partitions, all dispatched at once (no credit limit)
  engine.submit(make_task("t", 0, buf));
  ASSERT_TRUE(wait_bounded(engine).ok());
  EXPECT_GE(stage->max_inside(), 2) << "two partitions were in the stage at the same time";
  EXPECT_EQ(stage->decoded.load(), 4);
  EXPECT_EQ(backend->order().size(), 4u);
}

// Stages finish out of order; the backend still sees the batches in the order the policy dispatched them.
class ReversingStage final : public Stage {
 public:
  std::string_view name() const override { return "reversing"; }
  bool applies(const TaskDesc&) const override { return true; }
  void encode(const PartitionView& in, PartitionView&, std::unique_ptr<StageState>&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(4 - std::min<int>(3, static_cast<int>(in.index))));
  }
  void decode(const PartitionView&, const PartitionView&, std::unique_ptr<StageState>&) override {}
};

TEST(EngineStages, BackendSeesDispatchOrderWhateverTheStagesTake) {
  auto backend = std::make_shared<RecordingBackend>();
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), backend, config_with(1024, 0), {std::make_shared<ReversingStage>()});
  std::vector<float> buf(8 * 256);
  engine.submit(make_task("t", 0, buf));
  ASSERT_TRUE(wait_bounded(engine).ok());
  const auto order = backend->order();
  ASSERT_EQ(order.size(), 8u);
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(order[i].index, i);
}

// Credit gates what enters the chain: with a credit of two partitions, never more than two are between dispatch
// and completion, stages included.
class CountingStage final : public Stage {
 public:
  std::string_view name() const override { return "counting"; }
  bool applies(const TaskDesc&) const override { return true; }
  void encode(const PartitionView&, PartitionView&, std::unique_ptr<StageState>&) override {
    const int now = ++between;
    int seen = max_between.load();
    while (now > seen && !max_between.compare_exchange_weak(seen, now)) {}
  }
  void decode(const PartitionView&, const PartitionView&, std::unique_ptr<StageState>&) override { --between; }
  std::atomic<int> between{0}, max_between{0};
};

TEST(EngineStages, CreditGatesWhatEntersTheChain) {
  auto stage = std::make_shared<CountingStage>();
  auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(50));
  Engine engine(std::make_unique<PriorityCreditPolicy>(2048, 0, false), backend, config_with(1024, 2048), {stage});
  std::vector<float> buf(32 * 256);
  engine.submit(make_task("t", 0, buf));
  ASSERT_TRUE(wait_bounded(engine).ok());
  EXPECT_LE(stage->max_between.load(), 2);
  EXPECT_EQ(backend->order().size(), 32u);
}

// ---------------------------------------------------------------- failure injection

// A stage that throws in encode or decode for partitions of the task named `victim`.
class FailingStage final : public Stage {
 public:
  FailingStage(std::string victim, bool in_decode) : victim_(std::move(victim)), in_decode_(in_decode) {}
  std::string_view name() const override { return "failing"; }
  bool applies(const TaskDesc&) const override { return true; }
  void encode(const PartitionView& in, PartitionView&, std::unique_ptr<StageState>&) override {
    if (!in_decode_ && in.task->name == victim_) throw std::runtime_error("injected encode failure");
  }
  void decode(const PartitionView&, const PartitionView& target, std::unique_ptr<StageState>&) override {
    if (in_decode_ && target.task->name == victim_) throw std::runtime_error("injected decode failure");
  }

 private:
  std::string victim_;
  bool in_decode_;
};

TEST(EngineFaults, StageFailureFailsItsTaskNamingTheStageAndTheEngineGoesOn) {
  for (bool in_decode : {false, true}) {
    auto backend = std::make_shared<RecordingBackend>();
    // Credit of one partition: the failed batch must give its credit back or the next task never goes.
    Engine engine(std::make_unique<PriorityCreditPolicy>(1024, 0, false), backend, config_with(1024, 1024),
                  {std::make_shared<FailingStage>("bad", in_decode)});
    std::vector<float> bad(3 * 256), good(3 * 256);
    Status bad_status, good_status;
    engine.submit(make_task("bad", 0, bad, [&](const Status& s) { bad_status = s; }));
    engine.submit(make_task("good", 1, good, [&](const Status& s) { good_status = s; }));
    const Status all = wait_bounded(engine);
    EXPECT_FALSE(all.ok());
    EXPECT_FALSE(bad_status.ok());
    EXPECT_TRUE(contains(bad_status.message, "stage 'failing' failed to " + std::string(in_decode ? "decode" : "encode") +
                                                 " task 'bad' partition 0: injected"))
        << bad_status.message;
    EXPECT_TRUE(good_status.ok()) << good_status.message;
    EXPECT_EQ(backend->order().size(), in_decode ? 6u : 3u) << "a batch whose encode failed skips the backend";
  }
}

// A policy that throws on the n-th call of one kind.
class FaultyPolicy final : public Policy {
 public:
  enum class At { arrival, poll, batch_done };
  FaultyPolicy(At at, int nth) : inner_(0, 0, false), at_(at), nth_(nth) {}
  std::string_view name() const override { return "faulty"; }
  void on_task_arrived(const TaskArrival& t, Nanos now) override {
    maybe_throw(At::arrival);
    inner_.on_task_arrived(t, now);
  }
  void on_batch_done(const Batch& b, Nanos now) override {
    maybe_throw(At::batch_done);
    inner_.on_batch_done(b, now);
  }
  void poll(Nanos now, std::vector<Batch>& out) override {
    maybe_throw(At::poll);
    inner_.poll(now, out);
  }
  size_t queued_partitions() const override { return inner_.queued_partitions(); }
  uint64_t bytes_in_flight() const override { return inner_.bytes_in_flight(); }

 private:
  void maybe_throw(At where) {
    if (where == at_ && ++calls_ == nth_) throw std::runtime_error("injected policy failure");
  }
  PriorityCreditPolicy inner_;
  At at_;
  int nth_, calls_ = 0;
};

TEST(EngineFaults, PolicyFailureFailsPendingAndLaterTasksNamingThePolicy) {
  const std::pair<FaultyPolicy::At, const char*> cases[] = {
      {FaultyPolicy::At::arrival, "on_task_arrived"}, {FaultyPolicy::At::poll, "poll"}, {FaultyPolicy::At::batch_done, "on_batch_done"}};
  for (const auto& [at, call] : cases) {
    auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(100));
    // poll throws at its first call: with unlimited credit one poll may dispatch all three tasks, so a later call
    // could come only after they completed (seen in CI under load).
    Engine engine(std::make_unique<FaultyPolicy>(at, at == FaultyPolicy::At::poll ? 1 : 2), backend, config_with(1024, 0));
    std::vector<std::vector<float>> bufs(6, std::vector<float>(4 * 256));
    std::atomic<int> calls{0}, failed{0};
    std::string message;
    std::mutex mu;
    auto cb = [&](const Status& s) {
      ++calls;
      if (s.ok()) return;
      ++failed;
      std::lock_guard lk(mu);
      if (message.empty()) message = s.message;
    };
    for (int i = 0; i < 3; ++i) engine.submit(make_task("t" + std::to_string(i), i, bufs[i], cb));
    const Status first = wait_bounded(engine);
    ASSERT_FALSE(first.ok()) << call;
    EXPECT_TRUE(contains(first.message, std::string("policy 'faulty' threw in ") + call + ": injected policy failure"))
        << first.message;
    // The engine cannot go on: later tasks fail too, with the same cause, and nothing hangs.
    for (int i = 3; i < 6; ++i) engine.submit(make_task("t" + std::to_string(i), i, bufs[i], cb));
    const Status later = wait_bounded(engine);
    EXPECT_FALSE(later.ok());
    EXPECT_TRUE(contains(later.message, "injected policy failure")) << later.message;
    EXPECT_EQ(calls.load(), 6) << call;
    EXPECT_GE(failed.load(), 4) << call;
  }
}

TEST(EngineFaults, BackendFailureFailsItsBatchNamingTheBackendAndTheEngineGoesOn) {
  Engine engine(std::make_unique<PriorityCreditPolicy>(1024, 0, false), std::make_shared<ThrowingBackend>(), config_with(1024, 1024));
  std::vector<float> a(2 * 256), b(2 * 256);
  Status sa, sb;
  engine.submit(make_task("victim", 0, a, [&](const Status& s) { sa = s; }));
  engine.submit(make_task("other", 1, b, [&](const Status& s) { sb = s; }));
  const Status all = wait_bounded(engine);
  EXPECT_FALSE(all.ok());
  EXPECT_TRUE(contains(sa.message, "backend 'throwing' failed to start: injected backend failure")) << sa.message;
  EXPECT_TRUE(sb.ok()) << sb.message;
  EXPECT_EQ(engine.stats().tasks_completed, 2u);
}

TEST(EngineFaults, ThrowingCallbackIsReportedByWaitAllAndOtherTasksStillComplete) {
  auto backend = std::make_shared<RecordingBackend>();
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), backend, config_with(1024, 0));
  std::vector<float> a(300), b(300);
  std::atomic<int> ok{0};
  engine.submit(make_task("thrower", 0, a, [](const Status&) { throw std::runtime_error("injected callback failure"); }));
  engine.submit(make_task("fine", 1, b, [&](const Status& s) { ok += s.ok(); }));
  const Status all = wait_bounded(engine);
  EXPECT_FALSE(all.ok());
  EXPECT_TRUE(contains(all.message, "callback of task 'thrower' threw: injected callback failure")) << all.message;
  EXPECT_EQ(ok.load(), 1);
  // Reported once: the next wait is clean.
  engine.submit(make_task("fine", 1, b, [&](const Status& s) { ok += s.ok(); }));
  EXPECT_TRUE(wait_bounded(engine).ok());
  EXPECT_EQ(ok.load(), 2);
}

}  // namespace
}  // namespace commsched
