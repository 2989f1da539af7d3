#include "tuner/tuner_config.h"

#include <array>
#include <limits>
#include <string>

#include "scheduler/config.h"
#include "scheduler/types.h"

namespace commsched::tuner {
namespace {

constexpr std::array<std::string_view, 16> kOptions = {
    "trials", "min_trials", "ei_stop", "warmup", "window", "windows", "initial", "seed", "csv", "store", "reuse", "drift",
    "min_partition", "max_partition", "max_credit_multiple", "unlimited_credit"};

std::string var_name(std::string_view option) {
  std::string v = "COMMSCHED_TUNER_";
  for (char c : option) v += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return v;
}

int parse_count(std::string_view option, std::string_view value, int min, int max) {
  return static_cast<int>(parse_int(var_name(option), value, min, max));
}

}  // namespace

void TunerOptions::set(std::string_view option, std::string_view value) {
  if (option == "trials") {
    max_trials = parse_count(option, value, 1, 10000);
  } else if (option == "min_trials") {
    min_trials = parse_count(option, value, 1, 10000);
  } else if (option == "ei_stop") {
    stop_relative_ei = parse_double(var_name(option), value, 0.0, 1.0);
  } else if (option == "warmup") {
    warmup_iterations = parse_count(option, value, 0, 100000);
  } else if (option == "window") {
    window_iterations = parse_count(option, value, 1, 100000);
  } else if (option == "windows") {
    windows_per_trial = parse_count(option, value, 1, 1000);
  } else if (option == "initial") {
    initial_points = parse_count(option, value, 1, 1000);
  } else if (option == "seed") {
    seed = static_cast<uint64_t>(parse_int(var_name(option), value, 0, std::numeric_limits<int64_t>::max()));
  } else if (option == "csv") {
    csv_path = std::string(value);
  } else if (option == "store") {
    store_path = std::string(value);
  } else if (option == "reuse") {
    reuse_best = parse_bool(var_name(option), value);
  } else if (option == "drift") {
    drift_threshold = parse_double(var_name(option), value, 0.0, 10.0);
  } else if (!space.set(option, value)) {
    std::string allowed;
    for (auto o : kOptions) allowed += (allowed.empty() ? "" : ", ") + std::string(o);
    throw InvalidArgument("unknown tuner option '" + std::string(option) + "' (allowed: " + allowed + ")");
  }
}

TunerOptions TunerOptions::from_env() { return from_env(TunerOptions{}); }

TunerOptions TunerOptions::from_env(TunerOptions defaults) {
  TunerOptions o = std::move(defaults);
  for (auto option : kOptions) {
    if (auto v = env_value(var_name(option))) o.set(option, *v);
  }
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
