#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <future>
#include <numeric>
#include <thread>

#include "scheduler/bsp_policy.h"
#include "scheduler/engine.h"
#include "scheduler/fifo_policy.h"
#include "scheduler/policy_factory.h"
#include "scheduler/priority_credit_policy.h"
#include "tests/unit/scheduler/test_backends.h"

namespace commsched {
namespace {

using testing::config_with;
using testing::HeldBackend;
using testing::make_task;
using testing::RecordingBackend;

TEST(Engine, UrgentTaskOvertakesBigTaskInFlight) {
  auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(0), /*auto_complete=*/false);
  // 1 KiB partitions, credit of two partitions: the big task can never have more than two partitions out.
  Engine engine(std::make_unique<PriorityCreditPolicy>(2048, 0, /*stall_guard=*/false), backend, config_with(1024, 2048));
  std::vector<float> big(64 * 256), small(256);  // 64 partitions and 1 partition
  engine.submit(make_task("big", /*prio=*/10, big));
  while (backend->started() < 2) std::this_thread::yield();
  engine.submit(make_task("urgent", /*prio=*/0, small));
  backend->release(1000);
  engine.wait_all();
  const auto order = backend->order();
  ASSERT_EQ(order.size(), 65u);
  size_t urgent_at = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].task == "urgent") urgent_at = i;
  EXPECT_EQ(urgent_at, 2u) << "the urgent partition goes right after the two already in flight";
}

TEST(Engine, FifoDoesNotReorder) {
  auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(0), /*auto_complete=*/false);
  Engine engine(std::make_unique<FifoPolicy>(), backend, config_with(1024, 2048));
  std::vector<float> big(64 * 256), small(256);
  engine.submit(make_task("big", 10, big));
  while (backend->started() < 1) std::this_thread::yield();
  engine.submit(make_task("urgent", 0, small));
  backend->release(1000);
  engine.wait_all();
  const auto order = backend->order();
  ASSERT_EQ(order.size(), 2u) << "FIFO sends whole tensors";
  EXPECT_EQ(order[0].task, "big");
  EXPECT_EQ(order[0].bytes, big.size() * 4);
}

TEST(Engine, CreditNeverExceededUnderConcurrency) {
  auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(20));
  constexpr uint64_t kPart = 4096, kCredit = 3 * kPart;
  Engine engine(std::make_unique<PriorityCreditPolicy>(kCredit, 0, /*stall_guard=*/false), backend, config_with(kPart, kCredit));
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> bufs(4 * 25);
  for (size_t i = 0; i < bufs.size(); ++i) bufs[i].resize(1 + (i * 7919) % 9000);  // awkward sizes up to ~35 KiB
  for (int th = 0; th < 4; ++th)
    threads.emplace_back([&, th] {
      for (int i = 0; i < 25; ++i) {
        auto& b = bufs[th * 25 + i];
        engine.submit(make_task("t" + std::to_string(th) + "_" + std::to_string(i), (i * 13) % 7, b));
      }
    });
  for (auto& t : threads) t.join();
  engine.wait_all();
  EXPECT_LE(backend->max_in_flight(), kCredit);
  EXPECT_GT(backend->max_in_flight(), kPart) << "the credit was actually used for more than one partition";
  EXPECT_FALSE(backend->misaligned());
  EXPECT_LE(backend->max_single_batch(), kPart);
}

TEST(Engine, TenThousandTasksFromFourThreadsEachCallbackExactlyOnce) {
  auto backend = std::make_shared<RecordingBackend>();
  Engine engine(std::make_unique<PriorityCreditPolicy>(64 * 1024), backend, config_with(1024, 64 * 1024));
  constexpr int kThreads = 4, kPerThread = 2500;
  std::vector<std::vector<float>> bufs(kThreads * kPerThread);
  for (size_t i = 0; i < bufs.size(); ++i) bufs[i].resize(i % 600);  // includes empty tensors
  std::vector<std::atomic<int>> calls(bufs.size());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th)
    threads.emplace_back([&, th] {
      for (int i = 0; i < kPerThread; ++i) {
        const int idx = th * kPerThread + i;
        engine.submit(make_task("task" + std::to_string(idx), idx % 50, bufs[idx], [&, idx](const Status& s) {
          calls[idx].fetch_add(1);
          if (!s.ok()) failures.fetch_add(1);
        }));
      }
    });
  for (auto& t : threads) t.join();
  engine.wait_all();
  for (size_t i = 0; i < calls.size(); ++i) ASSERT_EQ(calls[i].load(), 1) << "task" << i;
  EXPECT_EQ(failures.load(), 0);
  const auto st = engine.stats();
  EXPECT_EQ(st.tasks_submitted, 10000u);
  EXPECT_EQ(st.tasks_completed, 10000u);
  uint64_t expected_parts = 0;
  for (auto& b : bufs) expected_parts += partition_count(b.size(), DType::f32, 1024);
  EXPECT_EQ(st.partitions_dispatched, expected_parts);
}

TEST(Engine, ShutdownWithWorkInFlightFailsPendingCallbacks) {
  auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(0), /*auto_complete=*/false);
  auto engine = std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(4096), backend, config_with(1024, 4096));
  std::vector<float> a(10000), b(100);
  std::atomic<int> cancelled{0}, calls{0};
  auto cb = [&](const Status& s) {
    calls.fetch_add(1);
    if (s.code == Status::Code::cancelled) cancelled.fetch_add(1);
  };
  engine->submit(make_task("a", 1, a, cb));
  engine->submit(make_task("b", 0, b, cb));
  while (backend->started() < 1) std::this_thread::yield();
  EXPECT_FALSE(engine->wait_all_for(std::chrono::milliseconds(20))) << "nothing completes until released";
  engine->shutdown();
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(cancelled.load(), 2);
  EXPECT_TRUE(engine->wait_all_for(std::chrono::milliseconds(0)));
  EXPECT_THROW(engine->submit(make_task("c", 0, b)), InvalidArgument);
  engine.reset();  // destructor after shutdown is fine
}

TEST(Engine, BadInputIsRejectedAndEngineKeepsServing) {
  auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(0), /*auto_complete=*/false);
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), backend, config_with(1024, 0));
  std::vector<float> buf(100), other(100);
  std::atomic<int> ok{0};
  engine.submit(make_task("w", 0, buf, [&](const Status& s) { ok += s.ok(); }));
  try {
    engine.submit(make_task("w", 0, other));
    FAIL() << "duplicate name in flight accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("in flight"), std::string::npos);
  }
  Task null_task = make_task("n", 0, buf);
  null_task.buffer.data = nullptr;
  EXPECT_THROW(engine.submit(null_task), InvalidArgument);
  Task bad_dtype = make_task("d", 0, buf);
  bad_dtype.dtype = static_cast<DType>(99);
  EXPECT_THROW(engine.submit(bad_dtype), InvalidArgument);
  Task cuda = make_task("g", 0, buf);
  cuda.buffer.device = Device::cuda;
  EXPECT_THROW(engine.submit(cuda), InvalidArgument) << "the backend cannot carry CUDA buffers";
  backend->release(100);
  engine.wait_all();
  EXPECT_EQ(ok.load(), 1);
  // After completion the same name may be submitted again (next round).
  engine.submit(make_task("w", 0, buf, [&](const Status& s) { ok += s.ok(); }));
  backend->release(100);
  engine.wait_all();
  EXPECT_EQ(ok.load(), 2);
}

// Forwards to a policy and signals each time the scheduler has finished a run (it asks next_wakeup() after the
// run's dispatches): a test waits for the scheduler's decision instead of sleeping.
class SignallingPolicy final : public Policy {
 public:
  explicit SignallingPolicy(std::unique_ptr<Policy> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool splits_tasks() const override { return inner_->splits_tasks(); }
  void on_task_arrived(const TaskArrival& t, Nanos now) override { inner_->on_task_arrived(t, now); }
  void on_batch_done(const Batch& b, Nanos now) override { inner_->on_batch_done(b, now); }
  void on_backward_done(Nanos now) override { inner_->on_backward_done(now); }
  void on_flush(Nanos now) override { inner_->on_flush(now); }
  void set_knobs(const Knobs& k) override { inner_->set_knobs(k); }
  void poll(Nanos now, std::vector<Batch>& out) override { inner_->poll(now, out); }
  size_t queued_partitions() const override { return inner_->queued_partitions(); }
  uint64_t bytes_in_flight() const override { return inner_->bytes_in_flight(); }
  std::optional<Nanos> next_wakeup() const override {
    {
      std::lock_guard lk(mu_);
      last_queued_ = inner_->queued_partitions();
      ++runs_;
    }
    cv_.notify_all();
    return inner_->next_wakeup();
  }
  // Waits (bounded) for a finished scheduler run that left `queued` partitions held back.
  bool wait_for_run_with_queued(size_t queued) const {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(10), [&] { return runs_ > 0 && last_queued_ == queued; });
  }

 private:
  std::unique_ptr<Policy> inner_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable size_t last_queued_ = 0;
  mutable uint64_t runs_ = 0;
};

// Credit is released when a batch is sent: with a credit of one partition, all eight partitions go out although none
// has completed. Without sent notices the credit holds them back until completions arrive.
TEST(Engine, CreditIsReleasedWhenTheBackendReportsABatchSent) {
  for (bool notices : {true, false}) {
    auto backend = std::make_shared<HeldBackend>(notices);
    auto policy = std::make_unique<SignallingPolicy>(std::make_unique<PriorityCreditPolicy>(1024, 0, /*stall_guard=*/false));
    const SignallingPolicy& observed = *policy;
    Engine engine(std::move(policy), backend, config_with(1024, 1024));
    std::vector<float> buf(8 * 256);
    std::atomic<int> ok{0};
    engine.submit(make_task("t", 0, buf, [&](const Status& s) { ok += s.ok(); }));
    if (notices) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (backend->started() < 8 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      EXPECT_EQ(backend->started(), 8u) << "every partition goes out before any completes";
    } else {
      // The scheduler's decision, not a pause: a finished run holding seven partitions back, one dispatched.
      ASSERT_TRUE(observed.wait_for_run_with_queued(7));
      EXPECT_EQ(engine.stats().batches_dispatched, 1u) << "without sent notices the credit waits for completions";
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (backend->started() < 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      EXPECT_EQ(backend->started(), 1u);
    }
    while (!engine.wait_all_for(std::chrono::milliseconds(1))) backend->complete_all();
    EXPECT_EQ(ok.load(), 1);
    EXPECT_EQ(backend->started(), 8u);
  }
}

// Over a backend whose order is decided globally (collectives) the engine hands its own policy to the global order
// and forwards each task as it arrives: no credit holds the eight partitions back here, the policy handed over gets
// the knobs whole, at start and when they change.
TEST(Engine, ItsOwnPolicyGoesToAGlobalOrderWithEveryKnob) {
  auto backend = std::make_shared<HeldBackend>(/*sent_notices=*/false, /*global_order=*/true);
  Engine engine(std::make_unique<PriorityCreditPolicy>(1024, 0, /*stall_guard=*/false), backend, config_with(1024, 1024));
  EXPECT_EQ(backend->adopted(), "bytescheduler");
  EXPECT_EQ(engine.policy_name(), "bytescheduler") << "the engine names the policy that orders for it";
  std::vector<float> buf(8 * 256);
  engine.submit(make_task("t", 0, buf));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (backend->started() < 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(backend->started(), 1u) << "the task's eight partitions go out at once, as one batch";
  engine.set_knobs(Knobs{1024, 4096, 64 << 10});
  engine.backward_done();
  while (!engine.wait_all_for(std::chrono::milliseconds(1))) backend->complete_all();
  const std::vector<uint64_t> want = {1024, 4096};
  EXPECT_EQ(backend->credits(), want);
  EXPECT_EQ(backend->fusion_bounds().back(), 64u << 10) << "the policy that orders gets every knob";

  // A baseline is handed over like any policy, and gets the knobs as they are (it ignores the credit itself).
  auto fifo_backend = std::make_shared<HeldBackend>(false, true);
  Engine fifo(std::make_unique<FifoPolicy>(), fifo_backend, config_with(1024, 1024));
  EXPECT_EQ(fifo_backend->adopted(), "wfbp");
  fifo.set_knobs(Knobs{1024, 4096});
  fifo.backward_done();
  fifo.submit(make_task("u", 0, buf));
  while (!fifo.wait_all_for(std::chrono::milliseconds(1))) fifo_backend->complete_all();
  EXPECT_EQ(fifo_backend->credits(), (std::vector<uint64_t>{1024, 4096}));

  // One engine per such backend: a second one's policy is refused, naming why.
  try {
    Engine second(std::make_unique<FifoPolicy>(), fifo_backend, config_with(1024, 1024));
    ADD_FAILURE() << "a second engine took over the global order";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("one engine per collective backend"), std::string::npos) << e.what();
  }
}

// The end of backward and flushes reach the global order as iteration marks, each after the batches it covers, so
// rank 0's policy (BSP, MG-WFBP) hears every rank's end of backward.
TEST(Engine, IterationMarksFollowTheirBatchesToTheGlobalOrder) {
  auto backend = std::make_shared<HeldBackend>(/*sent_notices=*/false, /*global_order=*/true);
  EngineConfig cfg = config_with(1024, 0);
  cfg.policy = PolicyKind::bsp;
  Engine engine(make_policy(cfg), backend, cfg);
  std::vector<float> a(256), b(256), c(256);
  engine.submit(make_task("a", 0, a));
  engine.submit(make_task("b", 1, b));
  engine.backward_done();
  engine.submit(make_task("c", 0, c));
  engine.flush();
  const std::vector<std::string> want = {"start", "start", "backward", "start", "flush"};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (backend->log().size() < want.size() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(backend->log(), want) << "BSP's tasks go out as they arrive; rank 0's BSP holds them for the marks";
  while (!engine.wait_all_for(std::chrono::milliseconds(1))) backend->complete_all();
}

// Every policy, driven in real time (polls arrive late, timers fire late), finishes a few training-like iterations:
// gradients trickle in during backward, then backward_done. A policy that waits for a tick it keeps postponing, or
// for a backward_done that already came, hangs here.
class EveryPolicy : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(EveryPolicy, FinishesIterationsInRealTime) {
  auto backend = std::make_shared<RecordingBackend>(std::chrono::microseconds(200));
  EngineConfig cfg = config_with(64 * 1024, 256 * 1024);
  cfg.policy = GetParam();
  cfg.fusion_cycle_s = 0.002;
  Engine engine(make_policy(cfg), backend, cfg);
  std::vector<std::vector<float>> bufs(12);
  for (size_t i = 0; i < bufs.size(); ++i) bufs[i].resize(1000 + 30000 * (i % 4));
  std::atomic<int> ok{0};
  for (int it = 0; it < 3; ++it) {
    for (size_t k = 0; k < bufs.size(); ++k) {
      const size_t i = bufs.size() - 1 - k;
      engine.submit(make_task("g" + std::to_string(i), static_cast<int>(i), bufs[i], [&](const Status& s) { ok += s.ok(); }));
      std::this_thread::sleep_for(std::chrono::microseconds(300));  // pacing (backward's compute), not synchronisation
    }
    engine.backward_done();
    ASSERT_TRUE(engine.wait_all_for(std::chrono::seconds(20))) << policy_name(GetParam()) << " hung in iteration " << it;
  }
  EXPECT_EQ(ok.load(), 36);
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicy,
                         ::testing::ValuesIn(all_policies()),  // every registered policy
                         [](const auto& info) { return std::string(policy_name(info.param)); });

TEST(Engine, KnobsChangeAtIterationBoundary) {
  auto backend = std::make_shared<RecordingBackend>();
  Engine engine(std::make_unique<PriorityCreditPolicy>(0), backend, config_with(1024, 0));
  std::vector<float> buf(1024);  // 4 KiB
  engine.submit(make_task("w", 0, buf));
  engine.wait_all();
  engine.set_knobs(Knobs{2048, 4096});
  engine.submit(make_task("v", 0, buf));  // still this iteration: old partition size
  engine.wait_all();
  engine.backward_done();
  engine.submit(make_task("u", 0, buf));
  engine.wait_all();
  std::map<std::string, int> parts;
  for (const auto& d : backend->order()) parts[d.task]++;
  EXPECT_EQ(parts["w"], 4);
  EXPECT_EQ(parts["v"], 4);
  EXPECT_EQ(parts["u"], 2);
  EXPECT_EQ(engine.iteration(), 1u);
  EXPECT_EQ(engine.knobs().credit_bytes, 4096u);
}

// The fusion bound is a knob like the credit: set_knobs() reaches bytescheduler's policy at the next backward_done().
TEST(Engine, FusionBoundChangesAtIterationBoundary) {
  auto backend = std::make_shared<RecordingBackend>();
  auto owned = std::make_unique<PriorityCreditPolicy>(0);
  const PriorityCreditPolicy& policy = *owned;
  Engine engine(std::move(owned), backend, config_with(1024, 0));
  std::vector<float> buf(256);
  engine.set_knobs(Knobs{1024, 0, 64 << 10});
  engine.submit(make_task("w", 0, buf));
  engine.wait_all();
  EXPECT_EQ(policy.small_tensor_bytes(), 0u) << "not before the iteration boundary";
  engine.backward_done();
  engine.submit(make_task("v", 0, buf));  // queued behind the knob change: the scheduler has applied it once v is done
  engine.wait_all();
  EXPECT_EQ(policy.small_tensor_bytes(), 64u << 10);
  EXPECT_EQ(engine.knobs().small_tensor_bytes, 64u << 10);
}

// An eager task (a parameter broadcast) under BSP would wait for a backward that is not coming; flush() releases it
// and ends no iteration.
TEST(Engine, FlushReleasesHeldTasksWithoutEndingTheIteration) {
  auto backend = std::make_shared<RecordingBackend>();
  auto policy = std::make_unique<SignallingPolicy>(std::make_unique<BspPolicy>());
  const SignallingPolicy& observed = *policy;
  Engine engine(std::move(policy), backend, config_with(1024, 0));
  std::vector<float> buf(256);
  engine.submit(make_task("broadcast", 0, buf));
  ASSERT_TRUE(observed.wait_for_run_with_queued(1));  // the scheduler has seen it, and holds it
  EXPECT_EQ(engine.stats().batches_dispatched, 0u) << "BSP sent before the end of backward";
  engine.flush();
  EXPECT_TRUE(engine.wait_all_for(std::chrono::seconds(10)));
  EXPECT_EQ(engine.iteration(), 0u);
  engine.submit(make_task("grad", 0, buf));  // a gradient still waits for its backward
  ASSERT_TRUE(observed.wait_for_run_with_queued(1));
  EXPECT_EQ(engine.stats().batches_dispatched, 1u) << "only the flushed broadcast went";
  engine.backward_done();
  EXPECT_TRUE(engine.wait_all_for(std::chrono::seconds(10)));
  EXPECT_EQ(engine.iteration(), 1u);
}

// A backend that offers Horovod's join (through its capability row) and completes every batch inline; it records how
// many partitions it had been given when join() came.
class JoiningBackend final : public CommBackend, private RankJoin {
 public:
  std::string_view name() const override { return "joining"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::push_pull}, {Device::cpu});
    c.joins = const_cast<JoiningBackend*>(this);
    return c;
  }
  void shutdown() override {}
  std::atomic<int> started{0};
  int started_at_join = -1;

 private:
  void do_start(std::vector<PartitionView> batch, BatchDone, BatchDone done) override {
    started += static_cast<int>(batch.size());
    done(Status::Ok());
  }
  int join() override {
    started_at_join = started.load();
    return 1;
  }
};

TEST(Engine, JoinReachesTheBackendsRankJoinAfterThisRanksTasks) {
  auto backend = std::make_shared<JoiningBackend>();
  Engine engine(std::make_unique<FifoPolicy>(), backend, config_with(1024, 0));
  std::vector<float> a(256), b(512);
  engine.submit(make_task("a", 0, a));
  engine.submit(make_task("b", 0, b));
  EXPECT_EQ(engine.join(), 1) << "the rank that joined last, as the backend said";
  EXPECT_EQ(backend->started_at_join, 2) << "both tasks of this rank (one partition each: FIFO does not split) were "
                                           "started before join";
}

TEST(Engine, JoinOverABackendWithoutItNamesTheBackend) {
  Engine engine(std::make_unique<FifoPolicy>(), std::make_shared<RecordingBackend>(), config_with(1024, 0));
  try {
    engine.join();
    FAIL() << "join over a backend that cannot join returned";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("recording backend cannot stand in"), std::string::npos) << e.what();
  }
}

TEST(BackendCapabilities, CarriesExactlyThePairsOfItsRow) {
  OpDeviceSet row({Op::allreduce, Op::broadcast}, {Device::cuda});
  EXPECT_TRUE(row.has(Op::allreduce, Device::cuda));
  EXPECT_TRUE(row.has(Op::broadcast, Device::cuda));
  EXPECT_FALSE(row.has(Op::allreduce, Device::cpu));
  EXPECT_FALSE(row.has(Op::push_pull, Device::cuda));
  row.add(Op::push_pull, Device::cpu);
  EXPECT_TRUE(row.has(Op::push_pull, Device::cpu));
  EXPECT_FALSE(row.has(Op::push_pull, Device::cuda)) << "adding one pair adds no other";
}

}  // namespace
}  // namespace commsched
