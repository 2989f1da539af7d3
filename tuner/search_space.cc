#include "tuner/search_space.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "base/types.h"

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

std::array<KnobTuning, kKnobCount> registered_tunings() {
  std::array<KnobTuning, kKnobCount> out;
  for (size_t i = 0; i < kKnobCount; ++i) out[i] = kKnobs[i].tuning;
  return out;
}

KnobTuning& SearchSpaceBounds::operator[](std::string_view knob) {
  return knobs[static_cast<size_t>(&registered_knob(knob) - kKnobs)];
}
const KnobTuning& SearchSpaceBounds::operator[](std::string_view knob) const {
  return knobs[static_cast<size_t>(&registered_knob(knob) - kKnobs)];
}

std::vector<BoundOption> bound_options(const KnobSpec& k) {
  const std::string a(k.alias), words(k.name);
  auto env = [](std::string name) {
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return "COMMSCHED_TUNER_" + name;
  };
  switch (k.tuning.scale) {
    case KnobScale::fixed: return {};
    case KnobScale::log_bytes:
      return {{BoundOption::min, "min_" + a, env("min_" + a),
               "smallest " + words + " searched" + (k.tuning.off_band ? ", beside off" : "") + " (at least the " +
                   format_bytes(k.tuning.alignment) + " alignment)"},
              {BoundOption::max, "max_" + a, env("max_" + a), "largest " + words + " searched"}};
    case KnobScale::log_multiple: {
      std::vector<BoundOption> out = {{BoundOption::max, "max_" + a + "_multiple", env("max_" + a + "_multiple"),
                                       words + " searched from " + format_number(k.tuning.min) +
                                           "x to this many times " + std::string(k.tuning.of)}};
      if (k.tuning.unlimited_band)
        out.push_back({BoundOption::unlimited_band, "unlimited_" + a, env("unlimited_" + a),
                       "the " + words + " axis ends in a band meaning no limit"});
      return out;
    }
  }
  return {};
}

bool SearchSpaceBounds::set(std::string_view option, std::string_view value) {
  if (!bounds_table().has(option)) return false;
  bounds_table().set(*this, option, value);
  return true;
}

void SearchSpaceBounds::validate() const {
  for (size_t i = 0; i < kKnobCount; ++i) {
    const KnobTuning& t = knobs[i];
    const std::vector<BoundOption> opts = bound_options(kKnobs[i]);
    auto var = [&](BoundOption::Field f) {
      for (const BoundOption& o : opts)
        if (o.field == f) return o.env;
      return "knob " + std::string(kKnobs[i].name);
    };
    auto shown = [](double v) { return std::to_string(static_cast<uint64_t>(v)); };
    if (t.scale == KnobScale::log_bytes) {
      if (t.alignment == 0) throw InvalidArgument("tuner search space: " + std::string(kKnobs[i].name) + " alignment must be positive");
      if (t.min < double(t.alignment))
        throw InvalidArgument(var(BoundOption::min) + "=" + shown(t.min) + " is below the " + std::string(kKnobs[i].alias) +
                              " alignment of " + std::to_string(t.alignment) + " bytes" +
                              (t.off_band ? " (the off band already covers 0)" : ""));
      if (t.max < t.min)
        throw InvalidArgument(var(BoundOption::max) + "=" + shown(t.max) + " is below " + var(BoundOption::min) + "=" +
                              shown(t.min));
    } else if (t.scale == KnobScale::log_multiple) {
      if (!(t.max >= 1.0) || !std::isfinite(t.max) || t.max < t.min)
        throw InvalidArgument(var(BoundOption::max) + "=" + std::to_string(t.max) + " must be a finite number >= " +
                              format_number(std::max(1.0, t.min)));
    }
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
    // The bounds narrow a registered knob's tuning; another table's row keeps its own.
    Axis a{&k, knob_index(k.name) >= 0 ? bounds_[k.name] : k.tuning, -1};
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
