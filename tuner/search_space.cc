#include "tuner/search_space.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "scheduler/config.h"
#include "scheduler/types.h"

namespace commsched::tuner {

namespace {
// The search space's rows on their own (for set() below).
const OptionTable<SearchSpaceBounds>& bounds_table() {
  static const OptionTable<SearchSpaceBounds> table = [] {
    OptionTable<SearchSpaceBounds> t("tuner", "tuner search-space");
    SearchSpaceBounds::register_options(t, [](SearchSpaceBounds& b) -> SearchSpaceBounds& { return b; });
    return t;
  }();
  return table;
}
}  // namespace

bool SearchSpaceBounds::set(std::string_view option, std::string_view value) {
  if (!bounds_table().has(option)) return false;
  bounds_table().set(*this, option, value);
  return true;
}

void SearchSpaceBounds::validate() const {
  if (alignment == 0) throw InvalidArgument("tuner search space: alignment must be positive");
  if (min_partition_bytes < alignment) {
    throw InvalidArgument("COMMSCHED_TUNER_MIN_PARTITION=" + std::to_string(min_partition_bytes) +
                          " is below the partition alignment of " + std::to_string(alignment) + " bytes");
  }
  if (max_partition_bytes < min_partition_bytes) {
    throw InvalidArgument("COMMSCHED_TUNER_MAX_PARTITION=" + std::to_string(max_partition_bytes) +
                          " is below COMMSCHED_TUNER_MIN_PARTITION=" + std::to_string(min_partition_bytes));
  }
  if (!(max_credit_multiple >= 1.0) || !std::isfinite(max_credit_multiple)) {
    throw InvalidArgument("COMMSCHED_TUNER_MAX_CREDIT_MULTIPLE=" + std::to_string(max_credit_multiple) +
                          " must be a finite number >= 1");
  }
}

SearchSpace::SearchSpace(const SearchSpaceBounds& bounds) : bounds_(bounds) { bounds_.validate(); }

double SearchSpace::credit_octaves() const { return std::log2(bounds_.max_credit_multiple); }

double SearchSpace::credit_axis_octaves() const {
  return credit_octaves() + (bounds_.allow_unlimited_credit ? 1.0 : 0.0);
}

uint64_t SearchSpace::partition_bytes(double u) const {
  const double lo = static_cast<double>(bounds_.min_partition_bytes);
  const double hi = static_cast<double>(bounds_.max_partition_bytes);
  const double raw = lo * std::pow(hi / lo, std::clamp(u, 0.0, 1.0));
  const double a = static_cast<double>(bounds_.alignment);
  const auto aligned = static_cast<uint64_t>(std::llround(raw / a)) * bounds_.alignment;
  return std::clamp(aligned, bounds_.min_partition_bytes, bounds_.max_partition_bytes);
}

uint64_t SearchSpace::credit_bytes(double v, uint64_t partition) const {
  v = std::clamp(v, 0.0, 1.0);
  const double axis = credit_axis_octaves();
  if (axis <= 0.0) return bounds_.allow_unlimited_credit ? 0 : partition;  // max_multiple == 1, no unlimited band
  const double octave = v * axis;
  // The boundary itself belongs to the largest finite multiple so that from_knobs() round-trips it exactly.
  if (bounds_.allow_unlimited_credit && octave > credit_octaves() + 1e-9) return 0;
  const double multiple = std::clamp(std::exp2(octave), 1.0, bounds_.max_credit_multiple);
  return static_cast<uint64_t>(std::llround(multiple * static_cast<double>(partition)));
}

Knobs SearchSpace::to_knobs(std::span<const double> u) const {
  if (u.size() != static_cast<size_t>(kDim)) {
    throw InvalidArgument("SearchSpace::to_knobs: expected " + std::to_string(kDim) + " coordinates, got " +
                          std::to_string(u.size()));
  }
  for (size_t i = 0; i < u.size(); ++i) {
    if (!(u[i] >= 0.0 && u[i] <= 1.0)) {
      throw InvalidArgument("SearchSpace::to_knobs: coordinate " + std::to_string(i) + " = " + std::to_string(u[i]) +
                            " is outside [0,1]");
    }
  }
  Knobs k;
  k.partition_bytes = partition_bytes(u[0]);
  k.credit_bytes = credit_bytes(u[1], k.partition_bytes);
  return k;
}

SearchSpace::Point SearchSpace::from_knobs(const Knobs& k) const {
  Point p{0.0, 0.0};
  const double lo = static_cast<double>(bounds_.min_partition_bytes);
  const double hi = static_cast<double>(bounds_.max_partition_bytes);
  const uint64_t part = std::clamp(k.partition_bytes, bounds_.min_partition_bytes, bounds_.max_partition_bytes);
  if (hi > lo) p[0] = std::clamp(std::log(static_cast<double>(part) / lo) / std::log(hi / lo), 0.0, 1.0);

  const double axis = credit_axis_octaves();
  if (axis <= 0.0) return p;
  if (k.credit_bytes == 0) {
    p[1] = 1.0;  // unlimited, or the largest multiple when unlimited is not part of the space
    return p;
  }
  const double multiple = static_cast<double>(k.credit_bytes) / static_cast<double>(part);
  const double octave = std::clamp(std::log2(multiple), 0.0, credit_octaves());
  // A finite credit never maps into the unlimited band, even at the largest multiple.
  p[1] = std::clamp(octave / axis, 0.0, 1.0);
  return p;
}

}  // namespace commsched::tuner
