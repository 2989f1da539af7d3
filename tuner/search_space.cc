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
  const uint64_t fusion_alignment = registered_tuning("small_tensor_bytes").alignment;
  if (min_small_tensor_bytes < fusion_alignment) {
    throw InvalidArgument("COMMSCHED_TUNER_MIN_SMALL_TENSOR=" + std::to_string(min_small_tensor_bytes) +
                          " is below the fusion bound's alignment of " + std::to_string(fusion_alignment) +
                          " bytes (the off band already covers no fusion)");
  }
  if (max_small_tensor_bytes < min_small_tensor_bytes) {
    throw InvalidArgument("COMMSCHED_TUNER_MAX_SMALL_TENSOR=" + std::to_string(max_small_tensor_bytes) +
                          " is below COMMSCHED_TUNER_MIN_SMALL_TENSOR=" + std::to_string(min_small_tensor_bytes));
  }
  if (!(max_credit_multiple >= 1.0) || !std::isfinite(max_credit_multiple)) {
    throw InvalidArgument("COMMSCHED_TUNER_MAX_CREDIT_MULTIPLE=" + std::to_string(max_credit_multiple) +
                          " must be a finite number >= 1");
  }
}

namespace {

double octaves(const KnobTuning& t) { return std::log2(t.max / t.min); }
double axis_octaves(const KnobTuning& t) {
  return octaves(t) + (t.unlimited_band ? 1.0 : 0.0) + (t.one_batch_band ? 1.0 : 0.0);
}
// log_bytes with an off band: the band is as wide as one octave of the sizes (all of the axis when min == max).
double off_band_width(const KnobTuning& t) { return 1.0 / (octaves(t) + 1.0); }
constexpr uint64_t kOneBatchInFlight = 1;  // a credit below any partition (scheduler/auto_knobs.h)

// The tuner's own options narrow the built-in knobs' registered bounds (their variables are named after them).
void apply_bounds(KnobTuning& t, std::string_view knob, const SearchSpaceBounds& b) {
  if (knob == "partition_bytes") {
    t.min = static_cast<double>(b.min_partition_bytes);
    t.max = static_cast<double>(b.max_partition_bytes);
    t.alignment = b.alignment;
  } else if (knob == "credit_bytes") {
    t.max = b.max_credit_multiple;
    t.unlimited_band = b.allow_unlimited_credit;
  } else if (knob == "small_tensor_bytes") {
    t.min = static_cast<double>(b.min_small_tensor_bytes);
    t.max = static_cast<double>(b.max_small_tensor_bytes);
  }
}

void check_tuning(const KnobSpec& k, const KnobTuning& t) {
  const std::string where = "tuner search space: knob '" + std::string(k.name) + "' ";
  if (!(t.min >= 1.0) || !(t.max >= t.min) || !std::isfinite(t.max))
    throw InvalidArgument(where + "has bounds [" + std::to_string(t.min) + ", " + std::to_string(t.max) +
                          "]: they must be finite, at least 1 and in order");
  if (t.alignment == 0) throw InvalidArgument(where + "has alignment 0");
}

}  // namespace

SearchSpace::SearchSpace(const SearchSpaceBounds& bounds, std::span<const KnobSpec> knobs) : bounds_(bounds) {
  bounds_.validate();
  for (const KnobSpec& k : knobs) {
    if (k.tuning.scale == KnobScale::fixed) continue;
    Axis a{&k, k.tuning, -1};
    apply_bounds(a.tuning, k.name, bounds_);
    check_tuning(k, a.tuning);
    if (a.tuning.scale == KnobScale::log_multiple) {
      for (size_t i = 0; i < axes_.size(); ++i)
        if (axes_[i].knob->name == a.tuning.of && axes_[i].tuning.scale == KnobScale::log_bytes) a.of = static_cast<int>(i);
      if (a.of < 0)
        throw InvalidArgument("tuner search space: knob '" + std::string(k.name) + "' is a multiple of '" +
                              std::string(a.tuning.of) + "', which is no searched byte-sized knob before it");
    }
    axes_.push_back(a);
  }
}

uint64_t SearchSpace::bytes_at(const Axis& a, double u) const {
  const double lo = a.tuning.min, hi = a.tuning.max;
  u = std::clamp(u, 0.0, 1.0);
  if (a.tuning.off_band) {
    // The band's upper boundary belongs to the smallest size, so that from_values() round-trips it exactly.
    const double band = off_band_width(a.tuning);
    if (u < band - 1e-9) return 0;
    u = band < 1.0 ? std::max(0.0, (u - band) / (1.0 - band)) : 0.0;
  }
  const double raw = lo * std::pow(hi / lo, std::clamp(u, 0.0, 1.0));
  const double align = static_cast<double>(a.tuning.alignment);
  const auto aligned = static_cast<uint64_t>(std::llround(raw / align)) * a.tuning.alignment;
  return std::clamp(aligned, static_cast<uint64_t>(lo), static_cast<uint64_t>(hi));
}

uint64_t SearchSpace::multiple_at(const Axis& a, double v, uint64_t base) const {
  const KnobTuning& t = a.tuning;
  const double axis = axis_octaves(t);
  double octave = std::clamp(v, 0.0, 1.0) * axis;
  if (t.one_batch_band) {
    // The band's upper boundary belongs to the smallest multiple, so that from_values() round-trips it exactly.
    if (octave < 1.0 - 1e-9) return kOneBatchInFlight;
    octave = std::max(0.0, octave - 1.0);
  }
  // The boundary itself belongs to the largest finite multiple so that from_values() round-trips it exactly.
  if (t.unlimited_band && octave > octaves(t) + 1e-9) return 0;
  const double multiple = std::clamp(t.min * std::exp2(octave), t.min, t.max);
  return static_cast<uint64_t>(std::llround(multiple * static_cast<double>(base)));
}

double SearchSpace::coordinate_of_bytes(const Axis& a, uint64_t bytes) const {
  const double lo = a.tuning.min, hi = a.tuning.max;
  const double band = a.tuning.off_band ? off_band_width(a.tuning) : 0.0;
  if (a.tuning.off_band && bytes == 0) return 0.0;  // off
  const uint64_t v = std::clamp(bytes, static_cast<uint64_t>(lo), static_cast<uint64_t>(hi));
  if (!(hi > lo)) return band;
  const double sized = std::clamp(std::log(static_cast<double>(v) / lo) / std::log(hi / lo), 0.0, 1.0);
  return band + (1.0 - band) * sized;
}

double SearchSpace::coordinate_of_multiple(const Axis& a, uint64_t value, uint64_t base) const {
  const KnobTuning& t = a.tuning;
  const double axis = axis_octaves(t);
  if (axis <= 0.0) return 0.0;
  if (value == 0) return 1.0;  // unlimited, or the largest multiple when unlimited is not part of the space
  const double multiple = static_cast<double>(value) / static_cast<double>(base);
  const double below = t.one_batch_band ? 1.0 : 0.0;  // the one-batch band's width
  if (t.one_batch_band && multiple < t.min) return 0.0;  // below one multiple: one batch in flight
  const double octave = std::clamp(std::log2(multiple / t.min), 0.0, octaves(t));
  // A finite value never maps into the unlimited band, even at the largest multiple.
  return std::clamp((below + octave) / axis, 0.0, 1.0);
}

SearchSpace::Values SearchSpace::to_values(std::span<const double> u) const {
  if (u.size() != axes_.size())
    throw InvalidArgument("tuner search space: expected " + std::to_string(axes_.size()) + " coordinates, got " +
                          std::to_string(u.size()));
  for (size_t i = 0; i < u.size(); ++i)
    if (!(u[i] >= 0.0 && u[i] <= 1.0))
      throw InvalidArgument("tuner search space: coordinate " + std::to_string(i) + " (" +
                            std::string(axes_[i].knob->name) + ") = " + std::to_string(u[i]) + " is outside [0,1]");
  Values v(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) {
    const Axis& a = axes_[i];
    v[i] = a.tuning.scale == KnobScale::log_bytes ? bytes_at(a, u[i]) : multiple_at(a, u[i], v[a.of]);
  }
  return v;
}

SearchSpace::Point SearchSpace::from_values(std::span<const uint64_t> v) const {
  if (v.size() != axes_.size())
    throw InvalidArgument("tuner search space: expected " + std::to_string(axes_.size()) + " knob values, got " +
                          std::to_string(v.size()));
  Point p(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) {
    const Axis& a = axes_[i];
    if (a.tuning.scale == KnobScale::log_bytes) {
      p[i] = coordinate_of_bytes(a, v[i]);
    } else {
      const Axis& of = axes_[a.of];
      const uint64_t base = std::clamp(v[a.of], static_cast<uint64_t>(of.tuning.min), static_cast<uint64_t>(of.tuning.max));
      p[i] = coordinate_of_multiple(a, v[i], base);
    }
  }
  return p;
}

Knobs SearchSpace::to_knobs(std::span<const double> u) const {
  const Values v = to_values(u);
  Knobs k;
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].knob->field) k.*axes_[i].knob->field = v[i];
  return k;
}

SearchSpace::Point SearchSpace::from_knobs(const Knobs& k) const {
  Values v(axes_.size(), 0);
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].knob->field) v[i] = k.*axes_[i].knob->field;
  Point p = from_values(v);
  for (size_t i = 0; i < axes_.size(); ++i)
    if (!axes_[i].knob->field) p[i] = 0.0;  // a knob Knobs cannot carry: its axis' low end
  return p;
}

}  // namespace commsched::tuner
