#include "tuner/online_tuner.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "scheduler/config.h"
#include "base/types.h"

namespace commsched::tuner {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

BayesOptOptions optimizer_options(const TunerOptions& o, const SearchSpace& space) {
  BayesOptOptions b;
  b.dim = space.dim();  // one per registered tunable knob
  b.goal = Goal::maximize;  // throughput
  b.seed = o.seed;
  b.initial_points = o.initial_points;
  return b;
}

}  // namespace

OnlineTuner::OnlineTuner(KnobControl& control, TuningKey key, TunerOptions options, AgreeFn agree, LogFn log,
                         bool is_leader)
    : control_(control),
      key_(std::move(key)),
      options_(std::move(options)),
      space_(options_.space),
      agree_(agree ? std::move(agree) : AgreeFn([](const Decision& d) { return d; })),
      log_(log ? std::move(log) : LogFn([](const std::string& s) { std::cerr << "[commsched tuner] " << s << '\n'; })),
      leader_(is_leader),
      optimizer_(optimizer_options(options_, space_)) {
  options_.validate();
  if (leader_ && !options_.csv_path.empty()) csv_ = TrialLog(options_.csv_path);
}

void OnlineTuner::on_iteration_end(uint64_t iteration, double seconds) {
  if (!(seconds > 0.0) || !std::isfinite(seconds)) {
    throw InvalidArgument("OnlineTuner::on_iteration_end: iteration " + std::to_string(iteration) +
                          " has a non-positive or non-finite duration " + std::to_string(seconds) + " s");
  }
  last_iteration_ = iteration;
  switch (state_) {
    case State::not_started: start(iteration); break;
    case State::measuring:
      tuning_seconds_ += seconds;
      measure(iteration, seconds);
      break;
    case State::finished: watch(seconds); break;
  }
}

void OnlineTuner::begin(uint64_t iteration) {
  if (state_ != State::not_started) throw std::logic_error("OnlineTuner::begin: tuning has already started");
  last_iteration_ = iteration;
  start(iteration);
}

// After tuning: the same windows as a trial, with one agreement at the end of each period (see the header).
void OnlineTuner::watch(double seconds) {
  if (options_.drift_threshold > 0 && period_complete(seconds)) end_watch();
}

// One iteration of a trial or watch period: warm-up iterations are dropped, then windows of iterations are timed.
// True when the period has all its windows.
bool OnlineTuner::period_complete(double seconds) {
  ++trial_iterations_;
  if (trial_iterations_ <= options_.warmup_iterations) return false;
  period_seconds_.push_back(seconds);
  window_seconds_ += seconds;
  if (++window_count_ < options_.window_iterations) return false;
  window_throughputs_.push_back(static_cast<double>(window_count_) / window_seconds_);
  window_seconds_ = 0.0;
  window_count_ = 0;
  return static_cast<int>(window_throughputs_.size()) == options_.windows_per_trial;
}

void OnlineTuner::reset_period() {
  trial_iterations_ = 0;
  window_seconds_ = 0.0;
  window_count_ = 0;
  window_throughputs_.clear();
  period_seconds_.clear();
}

double OnlineTuner::relative_error(int measured_iterations) const {
  if (pooled_dof_ <= 0 || measured_iterations <= 0) return 0.0;
  return std::sqrt(pooled_sum_ / pooled_dof_ / measured_iterations);
}

// Better than the best so far beyond the noise of both measurements (two combined standard errors).
bool OnlineTuner::beats_best(const TrialRecord& r) const {
  if (!best_knobs_) return true;
  const TrialRecord* best = nullptr;
  for (const TrialRecord& t : trials_)
    if (t.knobs == *best_knobs_) best = &t;
  const double best_error = best ? relative_error(best->iterations - options_.warmup_iterations) : 0.0;
  // The score is a median of windows, whose standard error is about 1.25 times the mean's.
  constexpr double kMedianEfficiency = 1.25;
  const double margin =
      2.0 * kMedianEfficiency * std::hypot(relative_error(r.iterations - options_.warmup_iterations), best_error);
  return r.score > best_score_ * (1.0 + margin);
}

void OnlineTuner::end_watch() {
  const double score = median(window_throughputs_);
  reset_period();
  const Knobs kept = control_.knobs();
  if (reference_score_ <= 0) reference_score_ = score;
  const double moved = std::abs(score / reference_score_ - 1.0);
  // Two periods in a row beyond the threshold: one slow period (a checkpoint, a straggling step) is no drift.
  drifted_periods_ = moved > options_.drift_threshold ? drifted_periods_ + 1 : 0;
  const bool retune = drifted_periods_ >= 2;
  if (agree_(Decision{kept, !retune}).final) return;
  if (leader_) {
    std::ostringstream s;
    s << "throughput moved " << 100 * moved << "% (from " << reference_score_ << " to " << score
      << " it/s, threshold " << 100 * options_.drift_threshold << "%): tuning again from " << describe(kept);
    log_(s.str());
  }
  restart_tuning();
}

void OnlineTuner::restart_tuning() {
  optimizer_ = BayesOpt(optimizer_options(options_, space_));
  pooled_sum_ = pooled_dof_ = 0.0;  // the noise of the network before the drift
  warm_start_.clear();  // predicted for the network before the drift
  trials_.clear();
  best_knobs_.reset();
  best_score_ = 0.0;
  reference_score_ = 0.0;
  drifted_periods_ = 0;
  tuning_seconds_ = 0.0;
  reused_ = false;
  first_iteration_ = last_iteration_ + 1;
  state_ = State::measuring;
  begin_trial(control_.knobs());
}

void OnlineTuner::start(uint64_t iteration) {
  first_iteration_ = iteration;
  // The first trial measures the warm start's first configuration, or else the one training started with (snapped
  // into the search space); the latter is always among the first two, so the tuner never ends worse than the
  // default it was given.
  const SearchSpace::Point here = space_.from_knobs(control_.knobs());
  Decision proposal{space_.to_knobs(here), false};
  if (options_.reuse_best && !options_.store_path.empty()) {
    try {
      if (auto stored = BestStore(options_.store_path).load(key_)) {
        proposal = {stored->knobs, true};
        best_score_ = stored->score;
      }
    } catch (const std::exception& e) {
      if (leader_) log_(std::string("ignoring the stored best configuration: ") + e.what());
    }
  }
  if (const std::optional<Knobs> warm = proposal.final ? std::nullopt : next_warm_start();
      warm && *warm != proposal.knobs) {
    // Start where the simulation says the optimum is; the starting configuration is measured right after it.
    warm_start_.insert(warm_start_.begin(), proposal.knobs);
    if (leader_) log_("starting from " + describe(*warm) + " (warm start; then " + describe(proposal.knobs) +
                      ", the configuration training started with)");
    proposal.knobs = *warm;
  }
  const Decision agreed = agree_(proposal);
  control_.set_knobs(agreed.knobs);
  if (agreed.final) {
    reused_ = true;
    finish(agreed.knobs);
    if (leader_) log_("reusing the stored configuration for " + key_.str() + ": " + describe(agreed.knobs));
    return;
  }
  best_score_ = 0.0;
  state_ = State::measuring;
  begin_trial(agreed.knobs);
}

void OnlineTuner::begin_trial(const Knobs& knobs) {
  trial_knobs_ = knobs;
  trial_first_iteration_ = last_iteration_ + 1;
  reset_period();
}

void OnlineTuner::measure(uint64_t /*iteration*/, double seconds) {
  if (period_complete(seconds)) end_trial();
}

void OnlineTuner::end_trial() {
  TrialRecord r;
  r.trial = trials_done() + 1;
  r.knobs = trial_knobs_;
  r.score = median(window_throughputs_);
  r.iterations = trial_iterations_;
  r.first_iteration = trial_first_iteration_;
  const auto x = space_.from_knobs(trial_knobs_);
  optimizer_.tell(x, r.score);
  pool_noise();
  r.noise = relative_error(r.iterations - options_.warmup_iterations);
  const bool faster = best_knobs_ && r.score > best_score_;
  const bool better = beats_best(r);
  if (better) {
    best_score_ = r.score;
    best_knobs_ = trial_knobs_;
  }
  r.best_score = best_score_;
  trials_.push_back(r);
  csv_.append(r);
  if (leader_) {
    std::ostringstream s;
    s << "trial " << r.trial << " of " << options_.max_trials << ": " << describe(r.knobs) << " -> " << r.score
      << " it/s";
    if (r.noise > 0) s << " +- " << 100 * r.noise << "%";
    s << prediction_note(r.knobs, r.score)
      << (faster && !better ? "; faster than the best but within the noise, so not taken" : "") << "; best "
      << best_score_ << " it/s (" << describe(*best_knobs_) << "); at most " << options_.max_trials - r.trial
      << " trials left, about " << std::llround(tuning_seconds_ / r.trial * (options_.max_trials - r.trial)) << " s";
    log_(s.str());
  }
  const Decision agreed = agree_(next_decision());
  control_.set_knobs(agreed.knobs);
  if (agreed.final) {
    finish(agreed.knobs);
  } else {
    begin_trial(agreed.knobs);
  }
}

// Adds the current trial's iteration times to the pooled relative variance.
void OnlineTuner::pool_noise() {
  const size_t n = period_seconds_.size();
  if (n < 2) return;
  double mean = 0;
  for (double t : period_seconds_) mean += t;
  mean /= double(n);
  double ss = 0;
  for (double t : period_seconds_) ss += (t / mean - 1.0) * (t / mean - 1.0);
  pooled_sum_ += ss;
  pooled_dof_ += double(n - 1);
}

void OnlineTuner::warm_start(std::vector<Knobs> first_trials, std::vector<double> predicted_s) {
  if (state_ != State::not_started)
    throw InvalidArgument("OnlineTuner::warm_start: call it before the first on_iteration_end()");
  if (!predicted_s.empty() && predicted_s.size() != first_trials.size())
    throw InvalidArgument("OnlineTuner::warm_start: " + std::to_string(predicted_s.size()) + " predictions for " +
                          std::to_string(first_trials.size()) + " configurations");
  predicted_.clear();
  for (size_t i = 0; i < predicted_s.size(); ++i)
    predicted_.emplace_back(space_.to_knobs(space_.from_knobs(first_trials[i])), predicted_s[i]);
  warm_start_ = std::move(first_trials);
}

// " (simulated 120.0 ms/iteration, measured 131.5)" for a configuration the warm start predicted.
std::string OnlineTuner::prediction_note(const Knobs& k, double score) const {
  for (const auto& [knobs, seconds] : predicted_) {
    if (knobs != k) continue;
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(1);
    s << " (simulated " << seconds * 1e3 << " ms/iteration, measured " << 1e3 / score << ")";
    return s.str();
  }
  return {};
}

std::optional<Knobs> OnlineTuner::next_warm_start() {
  while (!warm_start_.empty()) {
    const Knobs k = space_.to_knobs(space_.from_knobs(warm_start_.front()));
    warm_start_.erase(warm_start_.begin());
    // Every knob of the set: candidates that differ in the fusion bound alone are different trials.
    const bool measured = std::any_of(trials_.begin(), trials_.end(), [&](const TrialRecord& t) { return t.knobs == k; });
    if (!measured) return k;
  }
  return std::nullopt;
}

Decision OnlineTuner::next_decision() {
  const int done = trials_done();
  std::string reason;
  if (done >= options_.max_trials) {
    reason = "trial budget reached";
  } else if (const std::optional<Knobs> warm = next_warm_start()) {
    if (leader_) log_("next: " + describe(*warm) + " (warm start)");
    return {*warm, false};
  } else {
    const std::vector<double> next = optimizer_.ask();
    if (done < options_.min_trials ||
        !optimizer_.should_stop(static_cast<size_t>(options_.max_trials), options_.stop_relative_ei)) {
      return {space_.to_knobs(next), false};
    }
    reason = "expected improvement below " + std::to_string(options_.stop_relative_ei) + " of the best";
  }
  // Keep the best: the configuration no later trial beat beyond the noise (the one the log has called best).
  if (leader_) log_("stopping after " + std::to_string(done) + " trials (" + reason + ")");
  return {best_knobs_.value_or(trials_.front().knobs), true};
}

void OnlineTuner::finish(const Knobs& knobs) {
  state_ = State::finished;
  best_knobs_ = knobs;
  reference_score_ = 0.0;  // the first watch period after the switch measures the kept configuration
  drifted_periods_ = 0;
  reset_period();
  if (reused_) return;
  iterations_to_finish_ = last_iteration_ - first_iteration_ + 1;
  for (const auto& t : trials_) {
    if (t.knobs == knobs) {
      best_score_ = t.score;
    }
  }
  if (!leader_) return;
  log_("keeping " + describe(knobs) + " (" + std::to_string(best_score_) + " it/s) after " +
       std::to_string(iterations_to_finish_) + " iterations");
  if (options_.store_path.empty()) return;
  try {
    BestStore(options_.store_path).save(key_, {knobs, best_score_, trials_done()});
  } catch (const std::exception& e) {
    // Training goes on with the tuned knobs; only the next run loses the shortcut.
    log_(std::string("could not save the best configuration: ") + e.what());
  }
}

}  // namespace commsched::tuner
