// The name of a result row: a policy, and how its knobs were chosen. The simulator grid adds "<policy>-auto" (the
// knobs the product picks by itself, scheduler/auto_knobs.h) beside "<policy>" (the best of the grid or the tuner);
// `commsched run` takes "<policy>+tune" (the online tuner picks them while the run goes). One place writes and reads
// both suffixes, so a report and a command line agree on what a row is.
#pragma once

#include <string>
#include <string_view>

namespace commsched::sim {

enum class KnobSource { given, automatic, tuned };

struct RowLabel {
  std::string policy;
  KnobSource knobs = KnobSource::given;
};

inline constexpr std::string_view kAutomaticSuffix = "-auto";
inline constexpr std::string_view kTunedSuffix = "+tune";

inline std::string row_name(std::string_view policy, KnobSource knobs) {
  std::string name(policy);
  if (knobs == KnobSource::automatic) name += kAutomaticSuffix;
  if (knobs == KnobSource::tuned) name += kTunedSuffix;
  return name;
}

// The inverse of row_name; a name without a suffix is a policy with the knobs given.
inline RowLabel parse_row(std::string_view name) {
  for (auto [suffix, knobs] : {std::pair{kAutomaticSuffix, KnobSource::automatic}, std::pair{kTunedSuffix, KnobSource::tuned}})
    if (name.ends_with(suffix)) return {std::string(name.substr(0, name.size() - suffix.size())), knobs};
  return {std::string(name), KnobSource::given};
}

}  // namespace commsched::sim
