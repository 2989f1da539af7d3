// The tuner's search space: partition size and credit, both on log scales, normalised to the unit square.
//
// Coordinate 0 (partition): bytes = min * (max/min)^u, rounded to a multiple of `alignment`.
// Coordinate 1 (credit): credit is a multiple m of the partition size, because a credit below one partition would
// stall the scheduler and because the useful credit scales with the partition. The axis covers log2(max_multiple)
// octaves (1x .. max_multiple x) and, when unlimited credit is allowed, one more octave-wide band at the top that
// means "no limit" (Knobs::credit_bytes == 0). Placing "unlimited" just past the largest finite multiple keeps the
// objective smooth along the axis (a huge credit behaves like no credit limit), which suits the Gaussian process,
// and lets the tuner learn that scheduling does not pay on a fast network.
//   with unlimited:    v in [0, k/(k+1)] -> m = 2^(v (k+1)),  v in (k/(k+1), 1] -> unlimited,  k = log2(max_multiple)
//   without unlimited: v in [0, 1]       -> m = 2^(v k)
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "options/option_table.h"
#include "scheduler/policy.h"

namespace commsched::tuner {

struct SearchSpaceBounds {
  uint64_t min_partition_bytes = 64ull << 10;  // COMMSCHED_TUNER_MIN_PARTITION
  uint64_t max_partition_bytes = 64ull << 20;  // COMMSCHED_TUNER_MAX_PARTITION
  double max_credit_multiple = 64.0;           // COMMSCHED_TUNER_MAX_CREDIT_MULTIPLE (credit = 1x .. this x partition)
  bool allow_unlimited_credit = true;          // COMMSCHED_TUNER_UNLIMITED_CREDIT
  uint64_t alignment = 4096;                   // partition sizes are multiples of this (fits every dtype)

  // Applies one option by name ("min_partition", "max_partition", "max_credit_multiple", "unlimited_credit");
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
}

class SearchSpace {
 public:
  static constexpr int kDim = 2;
  using Point = std::array<double, kDim>;

  explicit SearchSpace(const SearchSpaceBounds& bounds = {});
  const SearchSpaceBounds& bounds() const { return bounds_; }

  // u must have kDim coordinates in [0,1]; throws InvalidArgument otherwise.
  Knobs to_knobs(std::span<const double> u) const;
  // Knobs outside the bounds are clamped onto them; credit_bytes == 0 maps to the unlimited band (or the largest
  // multiple when unlimited is not allowed).
  Point from_knobs(const Knobs& k) const;
  // The point the knobs for u actually land on (after rounding); what the optimizer should be told.
  Point snap(std::span<const double> u) const { return from_knobs(to_knobs(u)); }

  uint64_t partition_bytes(double u) const;
  // Credit for coordinate v given the partition size; 0 means unlimited.
  uint64_t credit_bytes(double v, uint64_t partition) const;

 private:
  double credit_octaves() const;  // k = log2(max_multiple)
  double credit_axis_octaves() const;  // k, plus one for the unlimited band

  SearchSpaceBounds bounds_;
};

}  // namespace commsched::tuner
