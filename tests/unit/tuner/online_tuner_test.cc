#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tuner/online_tuner.h"

namespace commsched::tuner {
namespace {

constexpr uint64_t MiB = 1024 * 1024;

// Noise-free iteration time of a synthetic model: fastest (0.1 s) at partition 1 MiB and credit 8 MiB (8x); slower
// away from it on log scales; unlimited credit behaves like a 128x credit, one batch in flight like half a partition.
double ideal_seconds(const Knobs& k) {
  const double lp = std::log2(static_cast<double>(k.partition_bytes) / (1.0 * MiB));
  const double multiple = k.credit_bytes == 0                   ? 128.0
                          : k.credit_bytes < k.partition_bytes ? 0.5
                                                                : static_cast<double>(k.credit_bytes) /
                                                                      static_cast<double>(k.partition_bytes);
  const double lc = std::log2(multiple) - 3.0;
  return 0.1 * (1.0 + 0.5 * std::pow(lp / 4.0, 2) + 0.3 * std::pow(lc / 4.0, 2));
}
constexpr double kBestThroughput = 10.0;  // 1 / 0.1 s

// A KnobControl like the engine's: set_knobs() takes effect at the next iteration boundary, and the first iteration
// after a switch is slow (caches, allocator), which the tuner's warm-up must absorb.
class FakeEngine : public KnobControl {
 public:
  explicit FakeEngine(uint64_t seed, double noise = 0.02) : rng_(seed), noise_(0.0, noise) {}
  Knobs knobs() const override { return active_; }
  void set_knobs(const Knobs& k) override { pending_ = k; }

  // Runs one iteration and returns its duration.
  // Every iteration takes this many times longer from now on (the network slowed down mid-run).
  void slow_down(double factor) { slowdown_ = factor; }

  double run_iteration() {
    bool switched = false;
    if (pending_) {
      switched = pending_->partition_bytes != active_.partition_bytes || pending_->credit_bytes != active_.credit_bytes;
      active_ = *pending_;
      pending_.reset();
    }
    return slowdown_ * ideal_seconds(active_) * (switched ? 1.8 : 1.0) * std::exp(noise_(rng_));
  }

 private:
  double slowdown_ = 1.0;
  Knobs active_{4 * MiB, 16 * MiB};
  std::optional<Knobs> pending_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> noise_;
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(testing::TempDir()) / ("commsched_tuner_" + name)).string();
}

TunerOptions test_options(const std::string& name) {
  TunerOptions o;
  o.csv_path = temp_path(name + ".csv");
  o.store_path = temp_path(name + ".json");
  std::filesystem::remove(o.store_path);
  return o;
}

// Drives the tuner until it finishes (or max_iterations); returns the iterations run.
int drive(OnlineTuner& tuner, FakeEngine& engine, int max_iterations = 1000) {
  int it = 0;
  for (; it < max_iterations && !tuner.finished(); ++it) tuner.on_iteration_end(it, engine.run_iteration());
  return it;
}

std::vector<std::string> quiet_log;
LogFn collect() {
  return [](const std::string& s) { quiet_log.push_back(s); };
}

TEST(OnlineTuner, EndsWithinFivePercentOfTheKnownOptimum) {
  int within = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    FakeEngine engine(seed);
    TunerOptions o = test_options("optimum" + std::to_string(seed));
    o.seed = seed;
    OnlineTuner tuner(engine, TuningKey{1, 2, 1, "fake"}, o, {}, collect());
    drive(tuner, engine);
    ASSERT_TRUE(tuner.finished());
    ASSERT_TRUE(tuner.best_knobs());
    const double throughput = 1.0 / ideal_seconds(*tuner.best_knobs());
    if (throughput >= 0.95 * kBestThroughput) ++within;
    EXPECT_LE(tuner.trials_done(), o.max_trials);
    engine.run_iteration();  // the final switch lands at the next iteration boundary
    EXPECT_EQ(engine.knobs().partition_bytes, tuner.best_knobs()->partition_bytes);
    EXPECT_EQ(engine.knobs().credit_bytes, tuner.best_knobs()->credit_bytes);
    EXPECT_LE(tuner.iterations_to_finish(), static_cast<uint64_t>(o.max_trials * o.iterations_per_trial() + 1));
  }
  EXPECT_EQ(within, 5);
}

// The knob describer names every knob of the set, the fusion bound by its short name, 0 as "off".
TEST(DescribeKnobs, NamesTheFusionBoundAndItsOffValue) {
  const std::string off = describe_knobs(Knobs{1 << 20, 8 << 20, 0});
  EXPECT_EQ(off, "partition 1 MiB, credit 8 MiB (8x), small_tensor off") << off;
  const std::string on = describe_knobs(Knobs{1 << 20, 0, 64 << 10});
  EXPECT_EQ(on, "partition 1 MiB, credit unlimited, small_tensor 64 KiB") << on;
}

TEST(OnlineTuner, WritesOneCsvRowPerTrialAndLogsProgress) {
  FakeEngine engine(3);
  TunerOptions o = test_options("csv");
  quiet_log.clear();
  OnlineTuner tuner(engine, TuningKey{2, 1, 0, "fake"}, o, {}, collect());
  drive(tuner, engine);
  std::ifstream in(o.csv_path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, TrialLog::header());
  EXPECT_EQ(line.rfind("trial,partition_bytes,credit_bytes,small_tensor_bytes,score_iter_per_s,noise_rel,", 0), 0u) << line;
  int rows = 0;
  while (std::getline(in, line)) {
    ++rows;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 8) << line;
    EXPECT_EQ(line.rfind(std::to_string(rows) + ",", 0), 0u) << line;
  }
  EXPECT_EQ(rows, tuner.trials_done());
  ASSERT_FALSE(quiet_log.empty());
  EXPECT_NE(quiet_log.front().find("trial 1 of " + std::to_string(o.max_trials)), std::string::npos)
      << quiet_log.front();
  EXPECT_NE(quiet_log.front().find("; best "), std::string::npos);
  EXPECT_NE(quiet_log.front().find("at most " + std::to_string(o.max_trials - 1) + " trials left, about "),
            std::string::npos)
      << quiet_log.front();
}

// Runs `iterations` more iterations; returns whether the tuner was re-tuning (not finished) at any of them.
bool retuned_within(OnlineTuner& tuner, FakeEngine& engine, uint64_t& it, int iterations) {
  bool retuned = false;
  for (int i = 0; i < iterations; ++i, ++it) {
    tuner.on_iteration_end(it, engine.run_iteration());
    retuned = retuned || !tuner.finished();
  }
  return retuned;
}

TEST(OnlineTuner, TunesAgainWhenThroughputDriftsAndOnlyThen) {
  FakeEngine engine(6);
  TunerOptions o = test_options("drift");
  o.drift_threshold = 0.25;
  quiet_log.clear();
  OnlineTuner tuner(engine, TuningKey{6, 2, 1, "fake"}, o, {}, collect());
  uint64_t it = static_cast<uint64_t>(drive(tuner, engine));
  ASSERT_TRUE(tuner.finished());
  // Steady throughput (2% noise): watching for several periods never re-tunes.
  EXPECT_FALSE(retuned_within(tuner, engine, it, 6 * o.iterations_per_trial()));
  // The network halves its speed: within three periods (two beyond the threshold in a row, the first perhaps only
  // partly slowed) the tuner starts again, says why, and finishes again.
  engine.slow_down(2.0);
  EXPECT_TRUE(retuned_within(tuner, engine, it, 3 * o.iterations_per_trial() + 1));
  const bool said = std::any_of(quiet_log.begin(), quiet_log.end(),
                                [](const std::string& l) { return l.find("tuning again from") != std::string::npos; });
  EXPECT_TRUE(said);
  for (int i = 0; i < 1000 && !tuner.finished(); ++i, ++it) tuner.on_iteration_end(it, engine.run_iteration());
  EXPECT_TRUE(tuner.finished());
}

TEST(OnlineTuner, DriftDecisionIsRankZerosAndDriftZeroNeverWatches) {
  for (double threshold : {0.25, 0.0}) {
    FakeEngine engine(7);
    TunerOptions o = test_options("drift_follow" + std::to_string(threshold));
    o.drift_threshold = threshold;
    int agreements = 0;
    bool after_finish = false;
    // This rank is not rank 0: rank 0 (the agree function) always answers "keep", whatever this rank measured.
    AgreeFn rank0_keeps = [&](const Decision& d) {
      ++agreements;
      return after_finish ? Decision{d.knobs, true} : d;
    };
    OnlineTuner tuner(engine, TuningKey{7, 2, 1, "fake"}, o, rank0_keeps, collect(), /*is_leader=*/false);
    uint64_t it = static_cast<uint64_t>(drive(tuner, engine));
    ASSERT_TRUE(tuner.finished());
    after_finish = true;
    const int before = agreements;
    engine.slow_down(3.0);
    EXPECT_FALSE(retuned_within(tuner, engine, it, 4 * o.iterations_per_trial()));
    // One agreement per watch period, or none when watching is off.
    EXPECT_EQ(agreements - before, threshold > 0 ? 4 : 0) << threshold;
  }
}

TEST(OnlineTuner, FirstTrialMeasuresTheStartingConfigurationAndDropsWarmup) {
  FakeEngine engine(4, 0.0);  // noise-free: the score must equal the ideal throughput exactly
  TunerOptions o = test_options("first");
  OnlineTuner tuner(engine, TuningKey{3, 1, 0, "fake"}, o, {}, collect());
  for (int it = 0; tuner.trials_done() < 2; ++it) tuner.on_iteration_end(it, engine.run_iteration());
  const TrialRecord& first = tuner.trials().front();
  EXPECT_EQ(first.knobs.partition_bytes, 4 * MiB);
  EXPECT_EQ(first.knobs.credit_bytes, 16 * MiB);
  EXPECT_NEAR(first.score, 1.0 / ideal_seconds(first.knobs), 1e-9);
  // The second trial switched knobs: its slow first iteration must not leak into the score.
  const TrialRecord& second = tuner.trials()[1];
  EXPECT_NEAR(second.score, 1.0 / ideal_seconds(second.knobs), 1e-9);
  EXPECT_EQ(second.iterations, o.iterations_per_trial());
  EXPECT_EQ(second.first_iteration, first.first_iteration + static_cast<uint64_t>(o.iterations_per_trial()));
}

// begin(): the first agreement and switch at the end of an iteration without a time; the warm start's first
// configuration is what the first trial measures, from the next iteration on.
TEST(OnlineTuner, BeginStartsWithoutATimeAndTheNextIterationsAreMeasured) {
  FakeEngine engine(5, 0.0);
  TunerOptions o = test_options("begin");
  OnlineTuner tuner(engine, TuningKey{4, 1, 0, "fake"}, o, {}, collect());
  const Knobs warm{1 * MiB, 8 * MiB};
  tuner.warm_start({warm});
  tuner.begin(0);
  EXPECT_EQ(tuner.trials_done(), 0);
  EXPECT_THROW(tuner.begin(1), std::logic_error);
  uint64_t it = 1;
  for (; tuner.trials_done() < 1; ++it) tuner.on_iteration_end(it, engine.run_iteration());
  const TrialRecord& first = tuner.trials().front();
  EXPECT_EQ(first.knobs, warm) << "begin() switched to the warm start's first configuration";
  EXPECT_EQ(first.first_iteration, 1u) << "the iteration that began tuning is not measured";
  EXPECT_EQ(it - 1, static_cast<uint64_t>(o.iterations_per_trial()));
  EXPECT_NEAR(first.score, 1.0 / ideal_seconds(warm), 1e-9) << "its warm-up dropped the switch's slow iteration";
}

// Warm-start candidates that differ in the fusion bound alone are each measured (neither is taken as already done).
TEST(OnlineTuner, WarmStartCandidatesDifferingOnlyInTheFusionBoundAreBothTried) {
  FakeEngine engine(6, 0.0);
  TunerOptions o = test_options("fusion_only");
  OnlineTuner tuner(engine, TuningKey{5, 1, 0, "fake"}, o, {}, collect());
  const Knobs off{1 * MiB, 8 * MiB, 0}, fused{1 * MiB, 8 * MiB, 64 * 1024};
  tuner.warm_start({off, fused});
  for (uint64_t it = 0; tuner.trials_done() < 3; ++it) tuner.on_iteration_end(it, engine.run_iteration());
  EXPECT_EQ(tuner.trials()[0].knobs, off);
  EXPECT_EQ(tuner.trials()[2].knobs, fused) << "after the starting configuration";
}

TEST(OnlineTuner, SavesTheBestAndReusesItForTheSameModelAndCluster) {
  TunerOptions o = test_options("store");
  const TuningKey key{model_signature(std::vector<uint64_t>{4096, 1 << 20, 3 << 20}), 4, 2, "ps"};
  Knobs tuned;
  {
    FakeEngine engine(5);
    OnlineTuner tuner(engine, key, o, {}, collect());
    drive(tuner, engine);
    ASSERT_TRUE(tuner.best_knobs());
    tuned = *tuner.best_knobs();
  }
  const auto stored = BestStore(o.store_path).load(key);
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->knobs.partition_bytes, tuned.partition_bytes);
  EXPECT_EQ(stored->knobs.credit_bytes, tuned.credit_bytes);

  FakeEngine engine(6);
  OnlineTuner again(engine, key, o, {}, collect());
  again.on_iteration_end(0, engine.run_iteration());
  EXPECT_TRUE(again.finished());
  EXPECT_TRUE(again.reused_stored_best());
  EXPECT_EQ(again.trials_done(), 0);
  engine.run_iteration();  // the switch lands at the next boundary
  EXPECT_EQ(engine.knobs().partition_bytes, tuned.partition_bytes);
  EXPECT_EQ(engine.knobs().credit_bytes, tuned.credit_bytes);

  // Another cluster shape is another key: it tunes, and the store then holds both.
  TuningKey other = key;
  other.workers = 8;
  FakeEngine engine2(7);
  OnlineTuner fresh(engine2, other, o, {}, collect());
  fresh.on_iteration_end(0, engine2.run_iteration());
  EXPECT_FALSE(fresh.finished());
  drive(fresh, engine2);
  EXPECT_TRUE(BestStore(o.store_path).load(key));
  EXPECT_TRUE(BestStore(o.store_path).load(other));
}

TEST(OnlineTuner, AMalformedStoreIsReportedAndTuningGoesOn) {
  TunerOptions o = test_options("malformed");
  std::ofstream(o.store_path) << "{ not json";
  quiet_log.clear();
  FakeEngine engine(8);
  OnlineTuner tuner(engine, TuningKey{}, o, {}, collect());
  tuner.on_iteration_end(0, engine.run_iteration());
  EXPECT_FALSE(tuner.finished());
  ASSERT_FALSE(quiet_log.empty());
  EXPECT_NE(quiet_log.front().find(o.store_path), std::string::npos) << quiet_log.front();
}

// Two ranks in lockstep: rank 0's decision is what both apply, and rank 0 alone decides when tuning stops, even
// though each rank measures its own (differently noisy) iteration times.
TEST(OnlineTuner, RanksFollowRankZeroDecisions) {
  std::optional<Decision> mailbox;
  int rank0_calls = 0, rank1_calls = 0;
  AgreeFn agree0 = [&](const Decision& d) {
    ++rank0_calls;
    mailbox = d;
    return d;
  };
  AgreeFn agree1 = [&](const Decision&) {
    ++rank1_calls;
    EXPECT_EQ(rank1_calls, rank0_calls);  // the same boundary on both ranks
    return *mailbox;
  };
  TunerOptions o0 = test_options("rank0"), o1 = test_options("rank1");
  o1.seed = 99;  // a different local optimizer state must not matter
  FakeEngine e0(10, 0.05), e1(11, 0.05);
  OnlineTuner r0(e0, TuningKey{}, o0, agree0, collect(), true);
  OnlineTuner r1(e1, TuningKey{}, o1, agree1, collect(), false);
  for (int it = 0; it < 1000 && !(r0.finished() && r1.finished()); ++it) {
    r0.on_iteration_end(it, e0.run_iteration());
    r1.on_iteration_end(it, e1.run_iteration());
    EXPECT_EQ(e0.knobs().partition_bytes, e1.knobs().partition_bytes);
    EXPECT_EQ(e0.knobs().credit_bytes, e1.knobs().credit_bytes);
  }
  EXPECT_TRUE(r0.finished());
  EXPECT_TRUE(r1.finished());
  EXPECT_EQ(rank0_calls, rank1_calls);
  EXPECT_EQ(r0.best_knobs()->partition_bytes, r1.best_knobs()->partition_bytes);
  EXPECT_EQ(r0.best_knobs()->credit_bytes, r1.best_knobs()->credit_bytes);
  EXPECT_FALSE(std::filesystem::exists(o1.csv_path) && std::filesystem::file_size(o1.csv_path) > 0);
  EXPECT_FALSE(std::filesystem::exists(o1.store_path));
}

// Two configurations, one `gain` times faster than the other, measured with 5% noise per iteration.
class TwoSpeeds : public KnobControl {
 public:
  TwoSpeeds(uint64_t seed, double gain) : rng_(seed), noise_(0.0, 0.05), gain_(gain) {}
  Knobs knobs() const override { return active_; }
  void set_knobs(const Knobs& k) override { active_ = k; }
  double run_iteration() {
    return (active_.partition_bytes == 4 * MiB ? 0.1 / gain_ : 0.1) * std::exp(noise_(rng_));
  }

 private:
  Knobs active_{4 * MiB, 16 * MiB};
  std::mt19937_64 rng_;
  std::normal_distribution<double> noise_;
  double gain_;
};

// Trial 1: 1 MiB (the warm start), trial 2: the starting 4 MiB; then the budget ends. Returns the knobs kept.
Knobs keep_of_two(uint64_t seed, double gain, std::vector<std::string>& log) {
  TwoSpeeds control(seed, gain);
  TunerOptions o;
  o.max_trials = 2;
  o.min_trials = 2;
  o.warmup_iterations = 1;
  o.window_iterations = 3;
  o.windows_per_trial = 3;
  o.drift_threshold = 0;
  OnlineTuner tuner(control, TuningKey{7, 2, 1, "fake"}, o, {}, [&](const std::string& s) { log.push_back(s); });
  tuner.warm_start({{1 * MiB, 8 * MiB}});
  for (uint64_t it = 0; it < 100 && !tuner.finished(); ++it) tuner.on_iteration_end(it, control.run_iteration());
  EXPECT_TRUE(tuner.finished());
  EXPECT_GT(tuner.trials()[1].noise, 0.005) << "5% per iteration over 9 iterations: about 1.7%";
  return *tuner.best_knobs();
}

TEST(OnlineTuner, AFasterMeasurementWithinTheNoiseDoesNotReplaceTheBest) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::vector<std::string> log;
    EXPECT_EQ(keep_of_two(seed, 1.0, log).partition_bytes, 1 * MiB) << "seed " << seed << ": equal speeds, noise";
    // The log calls best what is kept, after every trial.
    for (const std::string& line : log)
      if (line.rfind("trial ", 0) == 0) {
        EXPECT_NE(line.find("; best "), std::string::npos) << line;
      }
    EXPECT_NE(log.back().find("keeping partition 1 MiB"), std::string::npos) << log.back();
    const std::string& second = log[log.size() - 3];
    EXPECT_NE(second.find("best " ), std::string::npos);
    EXPECT_NE(second.find("(partition 1 MiB"), std::string::npos) << second;
  }
}

TEST(OnlineTuner, AnImprovementBeyondTheNoiseReplacesTheBest) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::vector<std::string> log;
    EXPECT_EQ(keep_of_two(seed, 1.2, log).partition_bytes, 4 * MiB) << "seed " << seed << ": 20% faster";
    EXPECT_NE(log.back().find("keeping partition 4 MiB"), std::string::npos) << log.back();
  }
}

TEST(OnlineTuner, RejectsBadIterationTimes) {
  FakeEngine engine(1);
  TunerOptions o;
  OnlineTuner tuner(engine, TuningKey{}, o, {}, collect());
  EXPECT_THROW(tuner.on_iteration_end(0, 0.0), InvalidArgument);
  EXPECT_THROW(tuner.on_iteration_end(0, std::nan("")), InvalidArgument);
}

}  // namespace
}  // namespace commsched::tuner
