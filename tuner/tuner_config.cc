#include "tuner/tuner_config.h"

#include <limits>
#include <string>

#include "base/types.h"

namespace commsched::tuner {
namespace {

std::string var(std::string_view option) {
  std::string v = "COMMSCHED_TUNER_";
  for (char c : option) v += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return v;
}

OptionTable<TunerOptions> build_tuner_table() {
  using O = TunerOptions;
  OptionTable<TunerOptions> t("tuner", "tuner");
  t.bind("trials", var("trials"), [](O& o) -> int& { return o.max_trials; }, int_value(1, 10000),
         "trial budget, the starting configuration included");
  t.bind("min_trials", var("min_trials"), [](O& o) -> int& { return o.min_trials; }, int_value(1, 10000),
         "no early stop on small expected improvement before this many trials");
  t.bind("ei_stop", var("ei_stop"), [](O& o) -> double& { return o.stop_relative_ei; }, number_value(0.0, 1.0),
         "stop when the largest expected improvement is below this fraction of the best score");
  t.bind("warmup", var("warmup"), [](O& o) -> int& { return o.warmup_iterations; }, int_value(0, 100000),
         "iterations dropped after each switch of configuration");
  t.bind("window", var("window"), [](O& o) -> int& { return o.window_iterations; }, int_value(1, 100000),
         "iterations per throughput window");
  t.bind("windows", var("windows"), [](O& o) -> int& { return o.windows_per_trial; }, int_value(1, 1000),
         "a trial's score is the median of this many windows");
  t.bind("initial", var("initial"), [](O& o) -> int& { return o.initial_points; }, int_value(1, 1000),
         "Latin-hypercube points before the model leads");
  t.bind("seed", var("seed"), [](O& o) -> uint64_t& { return o.seed; },
         int_value(0, std::numeric_limits<int64_t>::max()), "random seed of the optimizer");
  t.bind("csv", var("csv"), [](O& o) -> std::string& { return o.csv_path; }, text_value("a file path; empty: off"),
         "one row per trial");
  t.bind("store", var("store"), [](O& o) -> std::string& { return o.store_path; }, text_value("a file path; empty: off"),
         "JSON file of the best configurations, by model and cluster shape");
  t.bind("reuse", var("reuse"), [](O& o) -> bool& { return o.reuse_best; }, bool_value(),
         "skip tuning when the store has this model and cluster shape");
  t.bind("drift", var("drift"), [](O& o) -> double& { return o.drift_threshold; }, number_value(0.0, 10.0),
         "re-tune when throughput moves by more than this fraction, two periods in a row (0: never)");
  SearchSpaceBounds::register_options(t, [](O& o) -> SearchSpaceBounds& { return o.space; });
  return t;
}

}  // namespace

const OptionTable<TunerOptions>& tuner_option_table() {
  static const OptionTable<TunerOptions> table = build_tuner_table();
  return table;
}

void TunerOptions::set(std::string_view option, std::string_view value, std::string_view v) {
  tuner_option_table().set(*this, option, value, v);
}

TunerOptions TunerOptions::from_env() { return from_env(TunerOptions{}); }

TunerOptions TunerOptions::from_env(TunerOptions defaults) {
  TunerOptions o = std::move(defaults);
  tuner_option_table().set_from_env(o);
  constexpr ForeignVariable horovod[] = {{"HOROVOD_AUTOTUNE_LOG", "csv"}};  // Horovod's tuner log: one row per trial
  tuner_option_table().set_from_foreign_env(o, horovod);
  o.validate();
  return o;
}

void TunerOptions::validate() const {
  space.validate();
  if (max_trials < 1) throw InvalidArgument("COMMSCHED_TUNER_TRIALS must be >= 1, got " + std::to_string(max_trials));
  if (window_iterations < 1 || windows_per_trial < 1 || warmup_iterations < 0) {
    throw InvalidArgument("COMMSCHED_TUNER_WINDOW and COMMSCHED_TUNER_WINDOWS must be >= 1 and "
                          "COMMSCHED_TUNER_WARMUP >= 0");
  }
  if (!(stop_relative_ei >= 0.0)) {
    throw InvalidArgument("COMMSCHED_TUNER_EI_STOP must be >= 0, got " + std::to_string(stop_relative_ei));
  }
}

}  // namespace commsched::tuner
