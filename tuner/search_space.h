// The tuner's search space: one axis of [0,1] per knob of the knob set with a tuning scale (options/knobs.h
// kKnobs), in table order, so a knob registered as tunable is searched without an edit here. By default that is
// partition size, credit and the small-tensor fusion bound, all on log scales:
//
// partition (log_bytes): bytes = min * (max/min)^u, rounded to a multiple of `alignment`.
// credit (log_multiple of the partition): credit is a multiple m of the partition size, because the useful credit
// scales with the partition. The axis covers log2(max/min) octaves (min x .. max x) and, when unlimited credit is
// allowed, one more octave-wide band at the top that means "no limit" (Knobs::credit_bytes == 0). Placing "unlimited"
// just past the largest finite multiple keeps the objective smooth along the axis (a huge credit behaves like no
// credit limit), which suits the Gaussian process, and lets the tuner learn that scheduling does not pay on a fast
// network. Likewise an octave-wide band at the bottom (one_batch_band) means "one batch in flight"
// (credit_bytes == 1, below any partition: the policy sends one batch whenever nothing is in flight), which is what
// latency-bound collectives want and the next step down from a credit of one partition.
//   bands: [one batch] [m = min .. max, k = log2(max/min) octaves] [unlimited], each octave 1/(k + bands) of [0, 1]
// fusion bound (log_bytes with off_band): bytescheduler's small-tensor bound, with an octave-wide band at the bottom
// meaning 0 (no fusion), so the tuner weighs fusing at all next to fusing a little.
//   bands: [off] [bytes = min .. max, k = log2(max/min) octaves], each octave 1/(k + 1) of [0, 1]
//
// The tuner's options (SearchSpaceBounds) narrow the registered bounds of every knob; they are generated from the
// rows: a byte-sized knob has min_<alias> and max_<alias> (COMMSCHED_TUNER_MIN_PARTITION, ...), a multiple
// max_<alias>_multiple and, where its axis has the unlimited band, unlimited_<alias> (COMMSCHED_TUNER_UNLIMITED_CREDIT).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "options/knobs.h"
#include "options/option_table.h"
#include "scheduler/policy.h"

namespace commsched::tuner {

// The registered tuning of every row of kKnobs, in order.
std::array<KnobTuning, kKnobCount> registered_tunings();

struct SearchSpaceBounds {
  // Every knob's searched range, by row of kKnobs (defaults: the registered tuning rows).
  std::array<KnobTuning, kKnobCount> knobs = registered_tunings();

  // The range of a registered knob; throws InvalidArgument naming it when none.
  KnobTuning& operator[](std::string_view knob);
  const KnobTuning& operator[](std::string_view knob) const;

  // Applies one option by name ("min_partition", "max_credit_multiple", "unlimited_credit", ...); returns false when
  // the name is not a search-space option. Throws InvalidArgument on a bad value.
  bool set(std::string_view option, std::string_view value);
  // Adds the search space's rows (generated from the knob rows) to `table`; `bounds` reaches this struct inside the
  // table's Config.
  template <class Config, class Bounds>
  static void register_options(OptionTable<Config>& table, Bounds bounds);
  // Throws InvalidArgument naming the inconsistent option.
  void validate() const;
};

// The option names and docs of one knob's bounds (for register_options).
struct BoundOption {
  enum Field { min, max, unlimited_band } field;
  std::string name, env, doc;
};
std::vector<BoundOption> bound_options(const KnobSpec& knob);

template <class Config, class Bounds>
void SearchSpaceBounds::register_options(OptionTable<Config>& t, Bounds bounds) {
  for (size_t i = 0; i < kKnobCount; ++i) {
    for (const BoundOption& o : bound_options(kKnobs[i])) {
      if (o.field == BoundOption::unlimited_band) {
        t.bind(o.name, o.env, [bounds, i](Config& c) -> bool& { return bounds(c).knobs[i].unlimited_band; },
               bool_value(), o.doc);
      } else if (kKnobs[i].tuning.scale == KnobScale::log_multiple) {
        t.bind(o.name, o.env, [bounds, i](Config& c) -> double& { return bounds(c).knobs[i].max; },
               number_value(1.0, 1e6), o.doc);
      } else {
        const bool is_min = o.field == BoundOption::min;
        t.bind(o.name, o.env,
               [bounds, i, is_min](Config& c) -> double& { return is_min ? bounds(c).knobs[i].min : bounds(c).knobs[i].max; },
               size_value(), o.doc);
      }
    }
  }
}

class SearchSpace {
 public:
  // One searched knob: its registry row, and its tuning after the bounds' overrides.
  struct Axis {
    const KnobSpec* knob = nullptr;
    KnobTuning tuning;
    int of = -1;  // log_multiple: the axis of the knob it scales with
  };
  using Point = std::vector<double>;     // one coordinate in [0,1] per axis
  using Values = std::vector<uint64_t>;  // one knob value per axis (0: no limit or off, where the axis has that band)

  // The axes are the rows of `knobs` with a tuning scale. Throws InvalidArgument naming the bound or the knob whose
  // tuning is inconsistent (bounds out of order, `of` naming no earlier axis).
  explicit SearchSpace(const SearchSpaceBounds& bounds = {}, std::span<const KnobSpec> knobs = kKnobs);
  const SearchSpaceBounds& bounds() const { return bounds_; }
  int dim() const { return static_cast<int>(axes_.size()); }
  std::span<const Axis> axes() const { return axes_; }

  // u must have dim() coordinates in [0,1]; throws InvalidArgument otherwise.
  Values to_values(std::span<const double> u) const;
  // Values outside the bounds are clamped onto them; 0 on a log_multiple axis maps to its unlimited band (or the
  // largest multiple when the axis has none).
  Point from_values(std::span<const uint64_t> v) const;
  // The same through Knobs: every axis with a Knobs field reads or writes it; knobs not searched keep Knobs' defaults.
  Knobs to_knobs(std::span<const double> u) const;
  Point from_knobs(const Knobs& k) const;
  // The point the knobs for u actually land on (after rounding); what the optimizer should be told.
  Point snap(std::span<const double> u) const { return from_values(to_values(u)); }

 private:
  uint64_t bytes_at(const Axis& a, double u) const;
  uint64_t multiple_at(const Axis& a, double v, uint64_t base) const;  // 0: unlimited
  double coordinate_of_bytes(const Axis& a, uint64_t bytes) const;
  double coordinate_of_multiple(const Axis& a, uint64_t value, uint64_t base) const;

  SearchSpaceBounds bounds_;
  std::vector<Axis> axes_;
};

}  // namespace commsched::tuner
