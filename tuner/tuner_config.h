// Options of the online tuner: rows of the option registry (tuner_option_table(), the search space's included).
// Environment variables are COMMSCHED_TUNER_*; explicit options use the lower-case suffix ("trials", "warmup", ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "options/option_table.h"
#include "tuner/search_space.h"

namespace commsched::tuner {

struct TunerOptions {
  int max_trials = 12;            // COMMSCHED_TUNER_TRIALS: trial budget, the starting configuration included
  int min_trials = 8;             // COMMSCHED_TUNER_MIN_TRIALS: no early stop on small EI before this many trials
  double stop_relative_ei = 0.01; // COMMSCHED_TUNER_EI_STOP: stop when max EI < this fraction of the best score
  int warmup_iterations = 2;      // COMMSCHED_TUNER_WARMUP: iterations dropped after each switch
  int window_iterations = 3;      // COMMSCHED_TUNER_WINDOW: iterations per throughput window
  int windows_per_trial = 3;      // COMMSCHED_TUNER_WINDOWS: a trial's score is the median of this many windows
  int initial_points = 4;         // COMMSCHED_TUNER_INITIAL: Latin-hypercube points before the model leads
  uint64_t seed = 1;              // COMMSCHED_TUNER_SEED
  std::string csv_path;           // COMMSCHED_TUNER_CSV: one row per trial (empty: off)
  std::string store_path;         // COMMSCHED_TUNER_STORE: JSON file of best configurations (empty: off)
  bool reuse_best = true;         // COMMSCHED_TUNER_REUSE: skip tuning when the store has this model and cluster
  // COMMSCHED_TUNER_DRIFT: after tuning, throughput is still measured (one trial's windows at a time); when it moves
  // by more than this fraction from what the kept configuration measured first, in two periods in a row, tuning
  // starts again (the network or the load changed mid-run). 0: never re-tune.
  double drift_threshold = 0.25;
  SearchSpaceBounds space;        // COMMSCHED_TUNER_MIN_PARTITION, _MAX_PARTITION, _MAX_CREDIT_MULTIPLE, _UNLIMITED_CREDIT,
                                  // _MIN_SMALL_TENSOR, _MAX_SMALL_TENSOR

  // Applies one option by name; throws InvalidArgument naming an unknown option or a bad value.
  void set(std::string_view option, std::string_view value, std::string_view var = {});
  // Reads every COMMSCHED_TUNER_* variable this struct knows (unset ones keep the values of `defaults`), then
  // validates.
  static TunerOptions from_env(TunerOptions defaults);
  static TunerOptions from_env();
  // Throws InvalidArgument naming the inconsistent field.
  void validate() const;

  int iterations_per_trial() const { return warmup_iterations + window_iterations * windows_per_trial; }
};

// The registry rows of TunerOptions.
const OptionTable<TunerOptions>& tuner_option_table();

}  // namespace commsched::tuner
