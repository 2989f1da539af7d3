// The knob rows: every knob a tuner changes live is one row here, and everything that describes a knob is read from
// its row: the engine option and its COMMSCHED_ variable and CLI flags (scheduler/config.cc), the tuner's search axis
// and its bound options (tuner/search_space.h), the simulator's grid, its --tune axes and its grid flags
// (simulator/grid.h, simulator/bench_cli.cc), the warm start's candidates (simulator/warm_start.h), the words logs
// and result tables use (describe_knobs), the agreement message, the best-configuration store, the Python knob
// dictionary and the README's knob table (knobs_markdown). Adding a knob is one row here, a field of Knobs
// (base/types.h; its initializer is the default) and the code that uses it; check_knob_registry names what a
// row lacks.
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>

#include "options/option_table.h"
#include "base/types.h"

namespace commsched {

// How the tuner searches a knob (tuner/search_space.h): its axis of [0,1] maps onto values on a log scale.
enum class KnobScale {
  fixed,         // not searched
  log_bytes,     // bytes = min * (max/min)^u, rounded to a multiple of `alignment`
  log_multiple,  // a multiple (min .. max) of the knob named `of`, 2^octaves; optionally with a band at the bottom
                 // meaning 1 (below any multiple: one batch in flight) and one at the top meaning 0 (no limit)
};
struct KnobTuning {
  KnobScale scale = KnobScale::fixed;
  double min = 0, max = 0;       // log_bytes: bytes; log_multiple: multiples of `of` (min >= 1)
  uint64_t alignment = 1;        // log_bytes: values are multiples of this
  std::string_view of;           // log_multiple: the knob this one scales with (earlier in the table)
  bool unlimited_band = false;   // log_multiple: one more octave-wide band at the top means 0 (no limit)
  bool one_batch_band = false;   // log_multiple: one more octave-wide band at the bottom means 1 (one batch in flight)
  bool off_band = false;         // log_bytes: one more octave-wide band at the bottom means 0 (off)
};

// The simulator's grid of a knob on one network (`commsched bench`): the values searched, in the axis' unit (bytes;
// or multiples of `of`, where 0 is the bottom band), and the range --tune searches (0: the tuning row's).
struct KnobGrid {
  std::span<const double> values;
  double tune_min = 0, tune_max = 0;
};

struct KnobSpec {
  std::string_view name;   // the engine option and its variable (COMMSCHED_ + upper case)
  // The short name: a CLI alias ("--partition"), the label in logs ("partition 4 MiB") and the stem of the tuner's
  // bound options (COMMSCHED_TUNER_MIN_PARTITION; a multiple: COMMSCHED_TUNER_MAX_CREDIT_MULTIPLE).
  std::string_view alias;
  uint64_t Knobs::*field = nullptr;
  ZeroSize zero = ZeroSize::unlimited;  // the option's type: a size, and what 0 means to its parser and in logs
  std::string_view doc;
  KnobTuning tuning;           // the tuner's axis and default bounds (the tuner's options may narrow them)
  KnobGrid ps, allreduce;      // the simulator's grid per network
  std::string_view grid_flag;  // `commsched bench --<grid_flag> v,v,...`: the grid's values given
};

namespace knob_grids {
constexpr double KiB = 1024, MiB = 1024 * KiB;
// All-reduce at scale pays 2(W-1) latencies per collective, so its grid reaches bigger partitions and fusion bounds
// (as ByteScheduler itself tunes larger partitions for all-reduce). At 256 workers and 5 us per step a collective
// pays 2.55 ms, the time 16 MB take at 100 Gbit/s: the best messages are then hundreds of MiB (bytescheduler was
// 0.969x MG-WFBP on VGG-16 at 100 Gbit/s with its best knob in the corner of a grid that stopped at 64 MiB).
inline constexpr double partition_ps[] = {256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB};
inline constexpr double partition_allreduce[] = {1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB};
// Multiples of the partition; 0: one batch in flight at a time, which latency-bound collectives need.
inline constexpr double credit_ps[] = {0, 1, 2, 4, 8};
inline constexpr double credit_allreduce[] = {0, 1, 2};
inline constexpr double small_tensor_ps[] = {0, 64 * KiB, 8 * MiB};  // 0: off
inline constexpr double small_tensor_allreduce[] = {0, 1 * MiB, 8 * MiB, 32 * MiB, 128 * MiB};
}  // namespace knob_grids

inline constexpr KnobSpec kKnobs[] = {
    {.name = "partition_bytes",
     .alias = "partition",
     .field = &Knobs::partition_bytes,
     .zero = ZeroSize::unlimited,
     .doc = "bytescheduler partition size (unlimited: no split); when unset: automatic (scheduler/auto_knobs.h): "
            "parameter server the power of two nearest sqrt(64 MiB x per-message cost x link rate / min(workers, "
            "servers)) within 16 KiB-4 MiB (5 us a message; 1.2 ms where the workers fill the host's cores); "
            "all-reduce large enough that the ring latency is at most 1/64 of its bytes' time, at least 4 MiB",
     // 4 KiB alignment fits every dtype.
     .tuning = {KnobScale::log_bytes, 64.0 * 1024, 64.0 * 1024 * 1024, 4096, {}, false},
     .ps = {knob_grids::partition_ps},
     // Slow rings want partitions beyond the online tuner's range (the automatic all-reduce rule reaches 1 GiB).
     .allreduce = {knob_grids::partition_allreduce, 256 * knob_grids::KiB, 1024 * knob_grids::MiB},
     .grid_flag = "partitions"},
    {.name = "credit_bytes",
     .alias = "credit",
     .field = &Knobs::credit_bytes,
     .zero = ZeroSize::unlimited,
     .doc = "bytescheduler credit: bytes in flight (unlimited: no limit); when unset: parameter server 2 x (workers + 1) "
            "partitions up to 16 MiB (at least workers + 1), since every worker's push of a partition queues at one "
            "server's downlink and its receipt behind the sums in that server's send queue; all-reduce one batch in "
            "flight, since the collectives run one at a time and what queues meanwhile is fused",
     // A multiple of the partition: below one partition the scheduler stalls, and the useful credit scales with it.
     // One batch in flight is what latency-bound collectives want (scheduler/auto_knobs.h), so the tuner can reach it.
     .tuning = {KnobScale::log_multiple, 1.0, 64.0, 1, "partition_bytes", true, true},
     .ps = {knob_grids::credit_ps},
     .allreduce = {knob_grids::credit_allreduce},
     .grid_flag = "credit-multipliers"},
    {.name = "small_tensor_bytes",
     .alias = "small_tensor",
     .field = &Knobs::small_tensor_bytes,
     .zero = ZeroSize::off,
     .doc = "bytescheduler fuses queued tensors up to this size into one message (0: off; on all-reduce, 0 is "
            "automatic: one partition, at least 8 MiB)",
     // Off is the band below the smallest bound: the tuner learns whether fusing pays at all, next to fusing a little.
     // The top reaches the automatic all-reduce bound (one partition) of the large partitions slow rings want.
     .tuning = {KnobScale::log_bytes, 16.0 * 1024, 256.0 * 1024 * 1024, 4096, {}, false, false, true},
     .ps = {knob_grids::small_tensor_ps},
     .allreduce = {knob_grids::small_tensor_allreduce},
     .grid_flag = "small-tensor"},
};
inline constexpr size_t kKnobCount = std::size(kKnobs);

// The index of a row in kKnobs, or -1.
constexpr int knob_index(std::string_view knob) {
  for (size_t i = 0; i < kKnobCount; ++i)
    if (kKnobs[i].name == knob) return static_cast<int>(i);
  return -1;
}

// The row of a registered knob (constant-evaluated where the name is a literal); throws naming it when none.
constexpr const KnobSpec& registered_knob(std::string_view knob) {
  const int i = knob_index(knob);
  if (i < 0) throw InvalidArgument("no registered knob is named '" + std::string(knob) + "'");
  return kKnobs[i];
}
constexpr const KnobTuning& registered_tuning(std::string_view knob) { return registered_knob(knob).tuning; }

// What a row lacks (a reason to follow "knob 'NAME' "), or nullptr when it is complete: an alias, a Knobs field and a
// doc; a searched row consistent bounds (at least 1, in order, alignment > 0), for a multiple an earlier byte-sized row
// to scale with (among `earlier`), a grid flag and on both networks a grid within its range (0 only where the axis
// has a bottom band).
constexpr const char* knob_row_gap(const KnobSpec& k, std::span<const KnobSpec> earlier = {}) {
  if (k.alias.empty()) return "has no alias (its CLI name, log label and tuner bound stem)";
  if (k.field == nullptr) return "has no Knobs field: nothing would apply it (add a field to Knobs)";
  if (k.doc.empty()) return "has no doc";
  const KnobTuning& t = k.tuning;
  if (t.scale == KnobScale::fixed) return nullptr;
  if (!(t.min >= 1.0) || !(t.max >= t.min)) return "has tuning bounds that are not at least 1 and in order";
  if (t.alignment == 0) return "has tuning alignment 0";
  if (t.scale == KnobScale::log_multiple) {
    bool found = false;
    for (const KnobSpec& e : earlier) found = found || (e.name == t.of && e.tuning.scale == KnobScale::log_bytes);
    if (!found) return "is a multiple of a knob ('of') that is no byte-sized row before it";
  }
  if (k.grid_flag.empty()) return "has no grid flag for the simulator";
  const bool bottom_band = t.one_batch_band || t.off_band;
  for (const KnobGrid* g : {&k.ps, &k.allreduce}) {
    if (g->values.empty()) return "has an empty simulator grid (parameter server or all-reduce)";
    const double lo = g->tune_min > 0 ? g->tune_min : t.min, hi = g->tune_max > 0 ? g->tune_max : t.max;
    if (!(hi >= lo)) return "has a simulator tuning range out of order";
    for (double v : g->values)
      if (!((v == 0 && bottom_band) || (v >= lo && v <= hi)))
        return "has a simulator grid value outside its range (0 only where the axis has a bottom band)";
  }
  return nullptr;
}

// Every row complete, names and aliases distinct (checked at compile time for kKnobs below). Throws InvalidArgument
// naming the knob and what it lacks.
constexpr bool check_knob_registry(std::span<const KnobSpec> knobs) {
  for (size_t i = 0; i < knobs.size(); ++i) {
    if (knobs[i].name.empty()) throw InvalidArgument("a knob row has no name");
    if (const char* gap = knob_row_gap(knobs[i], knobs.first(i)))
      throw InvalidArgument("knob '" + std::string(knobs[i].name) + "' " + gap);
    for (size_t j = 0; j < i; ++j)
      if (knobs[j].name == knobs[i].name || knobs[j].alias == knobs[i].alias)
        throw InvalidArgument("knob '" + std::string(knobs[i].name) + "' repeats the name or alias of '" +
                              std::string(knobs[j].name) + "'");
  }
  return true;
}
static_assert(check_knob_registry(kKnobs));

// The default of a knob: its Knobs field's initializer.
inline uint64_t knob_default(const KnobSpec& k) { return Knobs{}.*k.field; }

// The value a grid's `value` (in the row's unit) sets the knob to, given the other knobs `k` (a multiple scales with
// its `of` knob; multiple 0 is below any partition: one batch in flight).
uint64_t knob_value_from_grid(const KnobSpec& row, double value, const Knobs& k);
// The grid value (the row's unit) a knob value stands for: bytes, or the multiple of its `of` knob (0: below one).
double knob_grid_value(const KnobSpec& row, const Knobs& k);

// How a knob's value reads in logs and result tables: "4 MiB", "8 MiB (8x)", "one batch in flight", "unlimited",
// "off".
std::string describe_knob(const KnobSpec& row, const Knobs& k);
// Every knob of `rows` by its alias: "partition 1 MiB, credit 8 MiB (8x), small_tensor off".
std::string describe_knobs(const Knobs& k, std::span<const KnobSpec> rows = kKnobs);

// The README's knob table (Markdown): per knob its option, type, default, the tuner's axis and bound options and
// the simulator's grids, as `commsched options --knobs` prints it.
std::string knobs_markdown();

}  // namespace commsched
