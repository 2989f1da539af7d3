// The tuner's search space: one axis of [0,1] per knob of the knob set with a tuning scale (scheduler/config.h
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
// The tuner's options (SearchSpaceBounds) narrow the registered bounds of the three built-in knobs.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "options/option_table.h"
#include "scheduler/config.h"
#include "scheduler/policy.h"

namespace commsched::tuner {

// Defaults: the knobs' registered tuning rows.
struct SearchSpaceBounds {
  uint64_t min_partition_bytes =  // COMMSCHED_TUNER_MIN_PARTITION
      static_cast<uint64_t>(registered_tuning("partition_bytes").min);
  uint64_t max_partition_bytes =  // COMMSCHED_TUNER_MAX_PARTITION
      static_cast<uint64_t>(registered_tuning("partition_bytes").max);
  // COMMSCHED_TUNER_MAX_CREDIT_MULTIPLE (credit = 1x .. this x partition)
  double max_credit_multiple = registered_tuning("credit_bytes").max;
  bool allow_unlimited_credit = registered_tuning("credit_bytes").unlimited_band;  // COMMSCHED_TUNER_UNLIMITED_CREDIT
  uint64_t alignment = registered_tuning("partition_bytes").alignment;  // partition sizes are multiples of this
  // The small-tensor fusion bound searched (beside its off band): COMMSCHED_TUNER_MIN_SMALL_TENSOR, _MAX_SMALL_TENSOR.
  uint64_t min_small_tensor_bytes = static_cast<uint64_t>(registered_tuning("small_tensor_bytes").min);
  uint64_t max_small_tensor_bytes = static_cast<uint64_t>(registered_tuning("small_tensor_bytes").max);

  // Applies one option by name ("min_partition", "max_partition", "max_credit_multiple", "unlimited_credit",
  // "min_small_tensor", "max_small_tensor");
  // returns false when the name is not a search-space option. Throws InvalidArgument on a bad value.
  bool set(std::string_view option, std::string_view value);
  // Adds the search space's rows to `table`; `bounds` reaches this struct inside the table's Config.
  template <class Config, class Bounds>
  static void register_options(OptionTable<Config>& table, Bounds bounds);
  // Throws InvalidArgument naming the inconsistent field.
  void validate() const;
};

template <class Config, class Bounds>
void SearchSpaceBounds::register_options(OptionTable<Config>& t, Bounds bounds) {
  t.bind("min_partition", "COMMSCHED_TUNER_MIN_PARTITION",
         [bounds](Config& c) -> uint64_t& { return bounds(c).min_partition_bytes; }, size_value(),
         "smallest partition size searched (at least the 4KiB alignment)");
  t.bind("max_partition", "COMMSCHED_TUNER_MAX_PARTITION",
         [bounds](Config& c) -> uint64_t& { return bounds(c).max_partition_bytes; }, size_value(),
         "largest partition size searched");
  t.bind("max_credit_multiple", "COMMSCHED_TUNER_MAX_CREDIT_MULTIPLE",
         [bounds](Config& c) -> double& { return bounds(c).max_credit_multiple; }, number_value(1.0, 1e6),
         "credit searched from 1x to this many times the partition size");
  t.bind("unlimited_credit", "COMMSCHED_TUNER_UNLIMITED_CREDIT",
         [bounds](Config& c) -> bool& { return bounds(c).allow_unlimited_credit; }, bool_value(),
         "the credit axis ends in a band meaning no limit");
  t.bind("min_small_tensor", "COMMSCHED_TUNER_MIN_SMALL_TENSOR",
         [bounds](Config& c) -> uint64_t& { return bounds(c).min_small_tensor_bytes; }, size_value(),
         "smallest small-tensor fusion bound searched, beside off (at least the 4KiB alignment)");
  t.bind("max_small_tensor", "COMMSCHED_TUNER_MAX_SMALL_TENSOR",
         [bounds](Config& c) -> uint64_t& { return bounds(c).max_small_tensor_bytes; }, size_value(),
         "largest small-tensor fusion bound searched");
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
