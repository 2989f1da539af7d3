// LiveTuner on real engines: ranks as threads over the loopback backend, whose sums are real.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "comm_backends/loopback/loopback_backend.h"
#include "plugins/api/context.h"
#include "plugins/api/live_tuner.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

using Clock = std::chrono::steady_clock;

TEST(LiveTuner, DecisionsRoundTripAndMalformedOnesAreRejected) {
  static_assert(kDecisionWordCount == 4, "partition, credit, fusion bound, final: update the malformed messages below");
  tuner::Decision d{Knobs{3 << 20, 0, 64 << 10}, true};
  int64_t buf[kDecisionWordCount];
  encode_decision(d, DecisionWords(buf));
  const tuner::Decision back = decode_decision(ConstDecisionWords(buf));
  EXPECT_EQ(back.knobs.partition_bytes, 3u << 20);
  EXPECT_EQ(back.knobs.credit_bytes, 0u);
  EXPECT_EQ(back.knobs.small_tensor_bytes, 64u << 10) << "the fusion bound travels with the decision";
  EXPECT_TRUE(back.final);
  EXPECT_EQ(buf[2], 64 << 10);
  int64_t bad[kDecisionWordCount] = {1024, -5, 0, 0};
  EXPECT_THROW(decode_decision(ConstDecisionWords(bad)), InvalidArgument);
  int64_t bad_fusion[kDecisionWordCount] = {1024, 1024, -1, 0};
  EXPECT_THROW(decode_decision(ConstDecisionWords(bad_fusion)), InvalidArgument);
  int64_t bad_flag[kDecisionWordCount] = {1024, 1024, 4096, 7};
  try {
    decode_decision(ConstDecisionWords(bad_flag));
    ADD_FAILURE() << "a final flag of 7 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("credit_bytes 1024"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("small_tensor_bytes 4096"), std::string::npos) << e.what();
  }
}

// A rank whose rank 0 never reaches the trial boundary gives up after the agreement limit with an error naming what
// it waited for, instead of blocking training forever; shutting the engines down afterwards is clean.
TEST(LiveTuner, AgreementThatNeverArrivesFailsAfterTheLimit) {
  auto backends = make_loopback_group(2);
  EngineConfig cfg;
  Engine rank0(std::make_unique<PriorityCreditPolicy>(cfg.knobs.credit_bytes), backends[0], cfg);
  Engine rank1(std::make_unique<PriorityCreditPolicy>(cfg.knobs.credit_bytes), backends[1], cfg);
  tuner::TunerOptions opts;
  opts.reuse_best = false;
  LiveTuner live(rank1, tuner::TuningKey{7, 2, 0, "loopback"}, opts, [](const std::string&) {},
                 std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  try {
    live.on_step(0.01);  // the first step starts the tuner: its first decision comes from rank 0, which is silent
    ADD_FAILURE() << "on_step returned without rank 0's decision";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 waiting for rank 0's decision"), std::string::npos) << what;
    EXPECT_NE(what.find("timed out"), std::string::npos) << what;
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  rank1.shutdown();
  rank0.shutdown();
}

// Integer data that every dtype sums exactly: rank, tensor, element and step mixed into a small value.
float value_of(int rank, size_t tensor, size_t elem, int step) {
  return static_cast<float>(static_cast<int>((rank * 3 + tensor * 5 + elem * 7 + static_cast<size_t>(step)) % 11) - 5);
}

// Three ranks tune live while really summing: every step's sums stay exact while the partition size and credit
// switch under them, every rank runs with the same knobs at every step (rank 0 decides), and the tuner finishes on
// every rank with the same configuration.
TEST(LiveTuner, RanksSwitchKnobsTogetherAndEverySumStaysExact) {
  constexpr int kRanks = 3;
  const std::vector<size_t> sizes = {1, 300, 5000, 40000, 150000, 600000};  // f32 elements: 4 B .. 2.3 MiB
  auto backends = make_loopback_group(kRanks, LinkModel{10e9, 20e-6});
  tuner::TunerOptions opts;
  opts.max_trials = 6;
  opts.min_trials = 6;
  opts.initial_points = 3;
  opts.warmup_iterations = 1;
  opts.window_iterations = 1;
  opts.windows_per_trial = 2;
  opts.reuse_best = false;
  const int max_steps = opts.max_trials * opts.iterations_per_trial() + 6;

  std::vector<std::vector<Knobs>> knobs_at_step(kRanks);
  std::vector<Knobs> final_knobs(kRanks);
  std::vector<int> finished(kRanks, 0);
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      EngineConfig cfg;
      cfg.knobs = Knobs{256 << 10, 1 << 20};
      Engine engine(std::make_unique<PriorityCreditPolicy>(cfg.knobs.credit_bytes), backends[r], cfg);
      LiveTuner live(engine, tuner::TuningKey{42, kRanks, 0, "loopback"}, opts);
      std::vector<std::vector<float>> data(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) data[i].resize(sizes[i]);
      for (int step = 0; step < max_steps; ++step) {
        const auto t0 = Clock::now();
        for (size_t i = 0; i < sizes.size(); ++i)
          for (size_t e = 0; e < sizes[i]; ++e) data[i][e] = value_of(r, i, e, step);
        knobs_at_step[r].push_back(engine.knobs());
        for (size_t k = 0; k < sizes.size(); ++k) {
          const size_t i = sizes.size() - 1 - k;  // backward: last layer first
          Task t;
          t.name = "layer" + std::to_string(i);
          t.priority = static_cast<int>(i);
          t.op = Op::allreduce;
          t.dtype = DType::f32;
          t.count = sizes[i];
          t.buffer.data = data[i].data();
          t.on_done = [&](const Status& s) { failed += !s.ok(); };
          engine.submit(std::move(t));
        }
        engine.backward_done();
        engine.wait_all();
        for (size_t i = 0; i < sizes.size(); ++i)
          for (size_t e = 0; e < sizes[i]; ++e) {
            float want = 0;
            for (int q = 0; q < kRanks; ++q) want += value_of(q, i, e, step);
            if (data[i][e] != want) ++wrong;
          }
        live.on_step(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      finished[r] = live.finished();
      final_knobs[r] = engine.knobs();
      engine.shutdown();
    });
  for (auto& t : threads) t.join();

  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0) << "a sum was wrong while the knobs switched";
  std::set<std::pair<uint64_t, uint64_t>> distinct;
  for (int step = 0; step < max_steps; ++step)
    for (int r = 1; r < kRanks; ++r) {
      ASSERT_EQ(knobs_at_step[r][step].partition_bytes, knobs_at_step[0][step].partition_bytes) << "step " << step;
      ASSERT_EQ(knobs_at_step[r][step].credit_bytes, knobs_at_step[0][step].credit_bytes) << "step " << step;
    }
  for (const Knobs& k : knobs_at_step[0]) distinct.insert({k.partition_bytes, k.credit_bytes});
  EXPECT_GE(distinct.size(), 4u) << "the tuner really switched configurations live";
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(finished[r]) << "rank " << r;
    EXPECT_EQ(final_knobs[r].partition_bytes, final_knobs[0].partition_bytes);
    EXPECT_EQ(final_knobs[r].credit_bytes, final_knobs[0].credit_bytes);
  }
}

// A single-process Context (loopback) with tuning on: the tuner starts at the first step's end (the model is given;
// the first step has no time, so it measures from the second), runs its trials through the engine's knobs and
// finishes; a bad tuner option fails at construction.
TEST(LiveTuner, ContextTunesWhenAsked) {
  ::setenv("COMMSCHED_TUNER_TRIALS", "3", 1);
  ::setenv("COMMSCHED_TUNER_MIN_TRIALS", "3", 1);
  ::setenv("COMMSCHED_TUNER_INITIAL", "2", 1);
  ::setenv("COMMSCHED_TUNER_WARMUP", "0", 1);
  ::setenv("COMMSCHED_TUNER_WINDOW", "1", 1);
  ::setenv("COMMSCHED_TUNER_WINDOWS", "1", 1);
  // Loopback steps of microseconds vary by far more than any drift threshold; re-tuning on drift is tested with a
  // controlled engine in tests/unit/tuner/test_online_tuner.cc.
  ::setenv("COMMSCHED_TUNER_DRIFT", "0", 1);
  ContextOptions opts;
  opts.tune = true;
  Context ctx(opts);
  const std::vector<uint64_t> sizes = {4096, 1 << 20};
  ctx.set_model(sizes);
  std::vector<float> a(1024), b(1 << 18);
  for (int step = 0; step < 8; ++step) {
    for (auto* buf : {&b, &a}) {
      Task t;
      t.name = buf == &a ? "a" : "b";
      t.priority = buf == &a ? 0 : 1;
      t.op = ctx.reduce_op();
      t.dtype = DType::f32;
      t.count = buf->size();
      t.buffer.data = buf->data();
      ctx.engine().submit(std::move(t));
    }
    ctx.engine().backward_done();
    ctx.engine().wait_all();
    ctx.iteration_end();
    if (step == 0) {
      EXPECT_NE(ctx.tuner(), nullptr) << "the model was given: the tuner begins at the first step";
    }
  }
  ASSERT_NE(ctx.tuner(), nullptr);
  EXPECT_TRUE(ctx.tuner()->finished());
  EXPECT_EQ(ctx.tuner()->tuner().trials_done(), 3);
  ::setenv("COMMSCHED_TUNER_TRIALS", "zero", 1);
  EXPECT_THROW(Context{opts}, InvalidArgument);
  for (const char* v : {"COMMSCHED_TUNER_TRIALS", "COMMSCHED_TUNER_MIN_TRIALS", "COMMSCHED_TUNER_INITIAL",
                        "COMMSCHED_TUNER_WARMUP", "COMMSCHED_TUNER_WINDOW", "COMMSCHED_TUNER_WINDOWS", "COMMSCHED_TUNER_DRIFT"})
    ::unsetenv(v);
}

// The tuner begins at the first step's end only where the warm start has a model to plan (set_model, every rank
// alike); the first step's time is never measured: the first trial's windows count from the second step on.
TEST(LiveTuner, TheTunerBeginsAtTheFirstStepWhenTheModelIsGiven) {
  ContextOptions opts;
  opts.tune = true;
  tuner::TunerOptions t;
  t.max_trials = t.min_trials = 2;
  t.warmup_iterations = 0;
  t.window_iterations = 1;
  t.windows_per_trial = 1;
  t.drift_threshold = 0;
  t.reuse_best = false;
  opts.tuner = t;
  for (bool model : {true, false}) {
    Context ctx(opts);
    const std::vector<uint64_t> sizes = {4096};
    if (model) ctx.set_model(sizes);
    std::vector<float> a(1024);
    for (int step = 0; step < 2; ++step) {
      Task task;
      task.name = "a";
      task.op = ctx.reduce_op();
      task.dtype = DType::f32;
      task.count = a.size();
      task.buffer.data = a.data();
      ctx.engine().submit(std::move(task));
      ctx.engine().backward_done();
      ctx.engine().wait_all();
      ctx.iteration_end();
      if (step == 0) {
        EXPECT_EQ(ctx.tuner() != nullptr, model) << (model ? "with" : "without") << " the model";
      } else {
        ASSERT_NE(ctx.tuner(), nullptr);
        // With the model: begun at step 1, step 2 is the first trial's only window (one trial done). Without: it
        // starts at step 2 (the first timed one), which it does not measure.
        EXPECT_EQ(ctx.tuner()->tuner().trials_done(), model ? 1 : 0) << (model ? "with" : "without") << " the model";
      }
    }
  }
}

}  // namespace
}  // namespace commsched
