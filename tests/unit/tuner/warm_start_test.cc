// OnlineTuner::warm_start: the configurations given are the first ones tried after the starting one, in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tuner/online_tuner.h"

namespace commsched::tuner {
namespace {

constexpr uint64_t MiB = 1024 * 1024;

// Fastest at partition 1 MiB and credit 8 MiB; switches take effect at the next iteration, as in the engine.
class Control : public KnobControl {
 public:
  Knobs knobs() const override { return active_; }
  void set_knobs(const Knobs& k) override { active_ = k; }
  double iteration_seconds() const {
    const double lp = std::log2(double(active_.partition_bytes) / MiB);
    const double lc = active_.credit_bytes == 0 ? 4 : std::log2(double(active_.credit_bytes) / active_.partition_bytes) - 3;
    return 0.1 * (1 + 0.5 * lp * lp / 16 + 0.3 * lc * lc / 16);
  }

 private:
  Knobs active_{4 * MiB, 16 * MiB};
};

TunerOptions quick() {
  TunerOptions o;
  o.max_trials = 6;
  o.min_trials = 6;
  o.warmup_iterations = 0;
  o.window_iterations = 1;
  o.windows_per_trial = 1;
  return o;
}

std::vector<Knobs> run(OnlineTuner& tuner, Control& control) {
  for (uint64_t it = 0; it < 100 && !tuner.finished(); ++it) tuner.on_iteration_end(it, control.iteration_seconds());
  std::vector<Knobs> tried;
  for (const TrialRecord& t : tuner.trials()) tried.push_back(t.knobs);
  return tried;
}

TEST(WarmStart, TuningStartsFromTheFirstThenTheStartingKnobsThenTheOthers) {
  Control control;
  std::vector<std::string> log;
  OnlineTuner tuner(control, TuningKey{1, 2, 1, "ps"}, quick(), {}, [&](const std::string& s) { log.push_back(s); });
  tuner.warm_start({{1 * MiB, 8 * MiB}, {4 * MiB, 16 * MiB} /* the start: skipped */, {256 << 10, 1 * MiB}},
                   {0.101, 0.2, 0.3});
  const std::vector<Knobs> tried = run(tuner, control);
  ASSERT_GE(tried.size(), 3u);
  EXPECT_EQ(tried[0].partition_bytes, 1 * MiB);  // the warm start's choice: where tuning starts
  EXPECT_EQ(tried[0].credit_bytes, 8 * MiB);
  EXPECT_EQ(tried[1].partition_bytes, 4 * MiB);  // the configuration training started with, right after
  EXPECT_EQ(tried[2].partition_bytes, 256u << 10);
  EXPECT_EQ(tried[2].credit_bytes, 1 * MiB);
  ASSERT_TRUE(tuner.finished());
  EXPECT_EQ(tuner.best_knobs()->partition_bytes, 1 * MiB) << "the predicted optimum, measured best, is kept";
  // Predicted against measured, for the log: the first trial measured 100 ms per iteration (1 MiB, 8 MiB).
  const auto said = [&](const std::string& what) {
    return std::any_of(log.begin(), log.end(), [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  EXPECT_TRUE(said("starting from partition 1 MiB, credit 8 MiB (8x) (warm start"));
  EXPECT_TRUE(said("(simulated 101.0 ms/iteration, measured 100.0)"));
}

TEST(WarmStart, PredictionsMustMatchTheConfigurations) {
  Control control;
  OnlineTuner tuner(control, TuningKey{1, 2, 1, "ps"}, quick(), {}, [](const std::string&) {});
  EXPECT_THROW(tuner.warm_start({{1 * MiB, 8 * MiB}}, {0.1, 0.2}), InvalidArgument);
}

TEST(WarmStart, KnobsOutsideTheSearchSpaceAreSnappedOntoItAndOneBatchInFlightIsInIt) {
  Control control;
  OnlineTuner tuner(control, TuningKey{1, 2, 1, "ps"}, quick(), {}, [](const std::string&) {});
  tuner.warm_start({{1 * MiB, 1}, {1ull << 40, 3 * (1ull << 40)}});  // one batch in flight; a partition too big
  const std::vector<Knobs> tried = run(tuner, control);
  ASSERT_GE(tried.size(), 3u);
  EXPECT_EQ(tried[0].partition_bytes, 1 * MiB);
  EXPECT_EQ(tried[0].credit_bytes, 1u) << "one batch in flight is a point of the search space";
  EXPECT_EQ(tried[2].partition_bytes, 64 * MiB) << "snapped onto the largest partition";
}

TEST(WarmStart, MustComeBeforeTheFirstIteration) {
  Control control;
  OnlineTuner tuner(control, TuningKey{1, 2, 1, "ps"}, quick(), {}, [](const std::string&) {});
  tuner.on_iteration_end(0, 0.1);
  EXPECT_THROW(tuner.warm_start({{1 * MiB, 8 * MiB}}), InvalidArgument);
}

}  // namespace
}  // namespace commsched::tuner
