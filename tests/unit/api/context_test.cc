// Context as the composition root of every entry point: an explicit engine configuration in place of the
// environment's, loopback groups (ranks as threads, as `commsched run` runs them), and the tuner's agreement going
// through the engine (a policy that holds tasks until backward's end does not stall it).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "plugins/api/context.h"
#include "plugins/api/live_tuner.h"

namespace commsched {
namespace {

// Sums one tensor per step on every rank of `group` (threads), ends each step with a measured step time, and returns
// how many elements were wrong.
int run_steps(std::vector<std::unique_ptr<Context>>& group, int steps, std::vector<uint64_t>* submitted = nullptr) {
  const int n = static_cast<int>(group.size());
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  if (submitted) submitted->assign(n, 0);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Context& ctx = *group[r];
      std::vector<float> data(20000);
      for (int step = 0; step < steps; ++step) {
        for (float& x : data) x = static_cast<float>(r + 1 + step);
        Task t;
        t.name = "grad";
        t.op = ctx.reduce_op();
        t.count = data.size();
        t.buffer.data = data.data();
        ctx.engine().submit(std::move(t));
        ctx.engine().backward_done();
        if (!ctx.engine().wait_all().ok()) ++wrong;
        const float want = static_cast<float>(n * (n + 1) / 2 + n * step);
        for (float x : data) wrong += x != want;
        ctx.iteration_end_measured(1e-3 * (1 + (step % 3)));
      }
      if (submitted) (*submitted)[r] = ctx.engine().stats().tasks_submitted;
    });
  for (auto& t : threads) t.join();
  return wrong.load();
}

TEST(Context, AnExplicitEngineConfigurationReplacesTheEnvironments) {
  ::setenv("COMMSCHED_POLICY", "bsp", 1);
  ContextOptions opts;
  opts.engine_config = EngineConfig{};
  opts.engine_config->policy = PolicyKind::wfbp;
  {
    Context ctx(opts);
    EXPECT_EQ(ctx.engine_config().policy, PolicyKind::wfbp);
  }
  opts.engine = {{"policy", "fusion"}};  // named options still apply over it
  {
    Context ctx(opts);
    EXPECT_EQ(ctx.engine_config().policy, PolicyKind::fusion);
  }
  Context from_env;
  EXPECT_EQ(from_env.engine_config().policy, PolicyKind::bsp);
  ::unsetenv("COMMSCHED_POLICY");
}

TEST(Context, LoopbackGroupRanksSumTogether) {
  ContextOptions opts;
  opts.engine_config = EngineConfig{};
  opts.engine_config->knobs.partition_bytes = 16 << 10;  // several partitions per task
  auto group = Context::loopback_group(3, LinkModel{}, opts);
  ASSERT_EQ(group.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(group[r]->rank(), r);
    EXPECT_EQ(group[r]->size(), 3);
    EXPECT_EQ(group[r]->backend_kind(), BackendKind::loopback);
    EXPECT_EQ(group[r]->reduce_op(), Op::allreduce);
    EXPECT_EQ(group[r]->engine_config().knobs.partition_bytes, 16u << 10);
  }
  EXPECT_EQ(run_steps(group, 3), 0);
  EXPECT_THROW(Context::loopback_group(0, LinkModel{}), InvalidArgument);
}

TEST(Context, MeasuredStepTimesMustBePositive) {
  Context ctx;
  ctx.iteration_end_measured(0.25);
  EXPECT_EQ(ctx.step_stats().steps, 1u);
  EXPECT_DOUBLE_EQ(ctx.step_stats().last_step_s, 0.25);
  EXPECT_THROW(ctx.iteration_end_measured(0), InvalidArgument);
  EXPECT_THROW(ctx.iteration_end_measured(-1), InvalidArgument);
  EXPECT_TRUE(ctx.tuning_finished()) << "tuning is off";
}

tuner::TunerOptions quick_tuner() {
  tuner::TunerOptions o;
  o.max_trials = 3;
  o.min_trials = 3;
  o.initial_points = 2;
  o.warmup_iterations = 0;
  o.window_iterations = 1;
  o.windows_per_trial = 1;
  o.reuse_best = false;
  o.drift_threshold = 0;  // loopback step times vary far more than any drift threshold
  return o;
}

// The agreement is a task of the engine: it is counted among the tasks each engine ran (one per decision), every rank
// ends with rank 0's knobs, and BSP, which holds tasks until backward_done(), does not stall it (Engine::flush()).
TEST(Context, TunerAgreementGoesThroughTheEngineForEveryPolicy) {
  for (const char* policy : {"bytescheduler", "bsp", "mgwfbp"}) {
    SCOPED_TRACE(policy);
    ContextOptions opts;
    opts.engine_config = EngineConfig{};
    opts.engine = {{"policy", policy}};
    opts.tune = true;
    opts.tuner = quick_tuner();
    auto group = Context::loopback_group(2, LinkModel{10e9, 10e-6}, opts);
    constexpr int kSteps = 8;
    std::vector<uint64_t> submitted;
    EXPECT_EQ(run_steps(group, kSteps, &submitted), 0);
    for (int r = 0; r < 2; ++r) {
      ASSERT_NE(group[r]->tuner(), nullptr);
      EXPECT_TRUE(group[r]->tuning_finished()) << "rank " << r;
      const uint64_t agreements = group[r]->tuner()->agreements();
      EXPECT_GT(agreements, 0u);
      EXPECT_EQ(submitted[r], kSteps + agreements) << "rank " << r << ": gradients plus one task per decision";
      EXPECT_EQ(group[r]->engine().knobs().partition_bytes, group[0]->engine().knobs().partition_bytes);
      EXPECT_EQ(group[r]->engine().knobs().credit_bytes, group[0]->engine().knobs().credit_bytes);
    }
  }
}

}  // namespace
}  // namespace commsched
