// The online auto-tuner: tunes the knob set (partition size, credit, fusion bound) live, while training runs,
// through a KnobControl.
//
// Protocol. The engine (or any driver) calls on_iteration_end() after every training iteration on every rank. The
// tuner runs a sequence of trials; each trial uses one configuration for a fixed number of iterations: warm-up
// iterations (dropped: the switch takes effect at an iteration boundary and caches settle), then windows of
// iterations whose throughput (iterations per second) is measured; the trial's score is the median window. Because
// the schedule counts iterations, not time, every rank reaches a trial boundary at the same iteration.
//
// Cross-worker agreement. At the first call and at every trial boundary every rank calls agree(proposal) exactly once;
// agree returns rank 0's proposal on every rank (the engine implements it as a broadcast through the backend; the
// default is the identity for one process). The decision carries a `final` flag so that rank 0 alone decides when
// tuning stops: a Knobs-only broadcast could not tell the other ranks to stop calling it, and ranks whose local
// measurements disagree about stopping would then deadlock in the next broadcast.
//
// Noise. A trial's score is the median window; its noise is the spread of the iteration times it measured, pooled over
// every trial so far (relative standard deviation per iteration, divided by the square root of the trial's measured
// iterations: the standard error of its mean). The best configuration is the first trial's until a later one
// measures faster by more than twice the combined standard error of the two (about 95% confidence); a faster
// measurement within that is reported as noise and does not replace it. The log's "best" is always that
// configuration, and it is the one kept at the end, so the log never names one configuration as best and keeps
// another.
//
// Stopping. On the trial budget, or when the optimizer's max expected improvement falls below a fraction of the best
// score (after min_trials); the tuner then switches to the best configuration and keeps it. The best is saved to a JSON store keyed by model signature and cluster shape; a later run with the
// same key reuses it without tuning.
//
// Watching (drift_threshold > 0). After the final decision the tuner goes on measuring, one trial's length at a time
// (warm-up, then windows). The first such period is the kept configuration's reference. At the end of every period
// every rank calls agree() once more (the iteration counts match on every rank, so the calls do); rank 0 proposes
// final = false when its median throughput moved by more than drift_threshold from the reference in two periods in
// a row (one slow period is no drift), and then every
// rank starts tuning again from the current knobs with a fresh optimizer (finished() is false until it ends).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/policy.h"
#include "tuner/bayes_opt.h"
#include "tuner/best_store.h"
#include "tuner/search_space.h"
#include "tuner/trial_log.h"
#include "tuner/tuner_config.h"

namespace commsched::tuner {

// What rank 0 decides at a trial boundary.
struct Decision {
  Knobs knobs;
  bool final = false;  // tuning is over; keep these knobs
};
using AgreeFn = std::function<Decision(const Decision& proposed_by_rank0)>;

// Every knob by its short name, for logs (the knob rows' describer, options/knobs.h): "partition 1 MiB, credit 8 MiB
// (8x), small_tensor off".
using commsched::describe_knobs;
using LogFn = std::function<void(const std::string&)>;

class OnlineTuner {
 public:
  // `control` must outlive the tuner. is_leader: this rank writes the CSV and the store and logs progress (rank 0).
  OnlineTuner(KnobControl& control, TuningKey key, TunerOptions options, AgreeFn agree = {}, LogFn log = {},
              bool is_leader = true);

  // Warm start: configurations to try first, in this order, for example the best ones the simulator predicts for the
  // job's profile and cluster (simulator/warm_start.h). The first one is where tuning starts (the first trial, agreed
  // by every rank), the configuration training started with comes right after it (so the tuner never ends worse than
  // the default it was given), then the others. They are measured like any trial, so a wrong prediction costs one
  // trial each and never decides by itself. `predicted_s` (empty, or one per configuration): the simulated time per
  // iteration, which the log sets beside the measured one. Only rank 0's list matters (its proposals are agreed).
  // Call before the first on_iteration_end(); knobs outside the search space are snapped onto it, ones already
  // measured are skipped.
  void warm_start(std::vector<Knobs> first_trials, std::vector<double> predicted_s = {});

  // Called after every training iteration with its wall time in seconds (> 0, finite; throws InvalidArgument).
  void on_iteration_end(uint64_t iteration, double seconds);
  // Starts tuning at the end of an iteration whose time is unknown (a process's first, which nothing clocked the
  // start of), as the first on_iteration_end() would: the first agreement and switch; the time of the iteration
  // that starts tuning is never used. Throws std::logic_error once started.
  void begin(uint64_t iteration);

  bool finished() const { return state_ == State::finished; }
  bool reused_stored_best() const { return reused_; }
  int trials_done() const { return static_cast<int>(trials_.size()); }
  const std::vector<TrialRecord>& trials() const { return trials_; }
  // The configuration kept (after finishing) or the best so far; nullopt before the first trial ends (unless reused).
  std::optional<Knobs> best_knobs() const { return best_knobs_; }
  double best_score() const { return best_score_; }
  // Iterations from the first call until the final decision (0 while tuning or when a stored best was reused).
  uint64_t iterations_to_finish() const { return iterations_to_finish_; }

 private:
  enum class State { not_started, measuring, finished };
  void watch(double seconds);
  bool period_complete(double seconds);
  void reset_period();
  void end_watch();
  void restart_tuning();

  void start(uint64_t iteration);
  void measure(uint64_t iteration, double seconds);
  void end_trial();
  Decision next_decision();
  std::optional<Knobs> next_warm_start();
  void finish(const Knobs& knobs);
  void begin_trial(const Knobs& knobs);
  std::string describe(const Knobs& k) const { return describe_knobs(k); }

  KnobControl& control_;
  TuningKey key_;
  TunerOptions options_;
  SearchSpace space_;
  AgreeFn agree_;
  LogFn log_;
  bool leader_;
  BayesOpt optimizer_;
  TrialLog csv_;

  State state_ = State::not_started;
  double reference_score_ = 0;  // watching: what the kept configuration measured in its first period (0: not yet)
  int drifted_periods_ = 0;     // watching: consecutive periods beyond the drift threshold
  double tuning_seconds_ = 0;   // time spent in trials so far (for the log's estimate of the time left)
  uint64_t first_iteration_ = 0;
  Knobs trial_knobs_;
  uint64_t trial_first_iteration_ = 0;
  int trial_iterations_ = 0;
  double window_seconds_ = 0.0;
  int window_count_ = 0;
  std::vector<double> window_throughputs_;
  std::vector<double> period_seconds_;  // the measured iterations of the current trial or period (after warm-up)
  // Pooled relative variance of iteration times: sum over trials of (n - 1) * variance / mean^2, and of (n - 1).
  double pooled_sum_ = 0.0;
  double pooled_dof_ = 0.0;
  double relative_error(int measured_iterations) const;  // of a trial's score; 0 while no noise was measured
  bool beats_best(const TrialRecord& r) const;
  void pool_noise();

  std::vector<Knobs> warm_start_;  // still to try, front first
  std::vector<std::pair<Knobs, double>> predicted_;  // simulated seconds per iteration, by (snapped) knobs
  std::string prediction_note(const Knobs& k, double score) const;
  std::vector<TrialRecord> trials_;
  std::optional<Knobs> best_knobs_;
  double best_score_ = 0.0;
  bool reused_ = false;
  uint64_t iterations_to_finish_ = 0;
  uint64_t last_iteration_ = 0;
};

}  // namespace commsched::tuner
