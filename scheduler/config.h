// Engine configuration, filled from the option registry (options/option_table.h): engine_option_table() is the one
// list of COMMSCHED_* engine variables, their parsers, defaults and docs; set() and from_env() only apply its rows.
#pragma once

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>

#include "compression/codec.h"
#include "options/option_table.h"
#include "options/parse.h"
#include "scheduler/policy.h"

namespace commsched {

// A policy, by its canonical name in the policy registry (scheduler/policy_factory.h). A value, not an enum, so a new
// policy needs no edit here: the constants below are shortcuts for code that singles out a built-in one.
class PolicyKind {
 public:
  constexpr PolicyKind() = default;
  // `name` must outlive the value (a literal, or a name from the registry).
  constexpr explicit PolicyKind(std::string_view name) : name_(name) {}
  constexpr std::string_view name() const { return name_; }
  friend constexpr bool operator==(PolicyKind a, PolicyKind b) { return a.name_ == b.name_; }

  static const PolicyKind bytescheduler, wfbp, bsp, fusion, mgwfbp;

 private:
  std::string_view name_ = "bytescheduler";
};
inline constexpr PolicyKind PolicyKind::bytescheduler{"bytescheduler"};
inline constexpr PolicyKind PolicyKind::wfbp{"wfbp"};
inline constexpr PolicyKind PolicyKind::bsp{"bsp"};
inline constexpr PolicyKind PolicyKind::fusion{"fusion"};
inline constexpr PolicyKind PolicyKind::mgwfbp{"mgwfbp"};

std::string_view policy_name(PolicyKind p);
// A registered name or alias, case-insensitive; the error names var, the value and every registered name.
PolicyKind parse_policy(std::string_view var, std::string_view value);

// Engine configuration. Each field is an option of engine_option_table(): the variable is COMMSCHED_ + the option
// name in upper case.
struct EngineConfig {
  PolicyKind policy;                      // policy
  Knobs knobs;                            // partition_bytes, credit_bytes, small_tensor_bytes (the knob set, kKnobs)
  uint64_t fusion_bytes = 64ull << 20;    // fusion_bytes (fusion policy threshold)
  double fusion_cycle_s = 0.005;          // fusion_cycle (fusion policy cycle)
  bool credit_stall_guard = true;         // credit_stall_guard: see PriorityCreditPolicy
  std::string timeline_path;              // timeline (empty: off)
  uint64_t timeline_max_events = 1'000'000;  // timeline_max_events
  double mg_alpha_s = 50e-6;              // mg_alpha: per-message latency for MG-WFBP
  double mg_beta_s_per_byte = 8.0 / 10e9; // mg_bandwidth (rate) -> seconds per byte
  compression::Spec compression;          // compression: none, fp16, bf16, topk:RATIO, signsgd
  // Whether partition_bytes / credit_bytes / small_tensor_bytes were given (option or environment); the composition
  // root replaces the others by the automatic knobs for the cluster's shape (scheduler/auto_knobs.h).
  bool partition_set = false;
  bool credit_set = false;
  bool small_tensor_set = false;

  // Applies one option by name or alias ("policy", "partition_bytes", ...); throws InvalidArgument naming it.
  // `var` is what a bad value's error names (default: the environment variable; a CLI passes its flag).
  void set(std::string_view option, std::string_view value, std::string_view var = {});
  // Reads every COMMSCHED_* variable of engine_option_table(), and BytePS's BYTEPS_PARTITION_BYTES and
  // BYTEPS_SCHEDULING_CREDIT (in partitions) below them.
  static EngineConfig from_env();
  // Checks cross-field consistency; throws InvalidArgument.
  void validate() const;
};

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

// The knob set: the knobs a tuner changes live, by name. The engine options, the tuner's search space and its
// agreement message, the best-configuration store and the Python knob dictionary iterate over it, so a new knob is
// one row here (and a field of Knobs); a row with a tuning scale is searched by the tuner with its bounds.
struct KnobSpec {
  std::string_view name;           // also its engine option and COMMSCHED_ variable
  std::string_view alias;          // a shorter name the CLI also takes ("--partition")
  uint64_t Knobs::*field;
  bool EngineConfig::*given;       // set when the option was given (auto_knobs replaces the others)
  std::string_view doc;
  KnobTuning tuning;               // the tuner's default bounds (the tuner's options may narrow them)
  ZeroSize zero = ZeroSize::unlimited;  // what 0 means to the option's parser and in logs
};
inline constexpr KnobSpec kKnobs[] = {
    {"partition_bytes", "partition", &Knobs::partition_bytes, &EngineConfig::partition_set,
     "bytescheduler partition size (unlimited: no split); when unset: automatic (scheduler/auto_knobs.h): parameter "
     "server 64 KiB; all-reduce large enough that the "
     "ring latency is at most 1/32 of its bytes' time, at least 4 MiB",
     // 4 KiB alignment fits every dtype.
     {KnobScale::log_bytes, 64.0 * 1024, 64.0 * 1024 * 1024, 4096, {}, false}},
    {"credit_bytes", "credit", &Knobs::credit_bytes, &EngineConfig::credit_set,
     "bytescheduler credit: bytes in flight (unlimited: no limit); when unset: parameter server 2 x (workers + 1) "
     "partitions up to 16 MiB (at least workers + 1), since every worker's push of a partition queues at one "
     "server's downlink and its receipt behind the sums in that server's send queue; all-reduce one batch in "
     "flight, since the collectives run one at a time and what queues meanwhile is fused",
     // A multiple of the partition: below one partition the scheduler stalls, and the useful credit scales with it.
     // One batch in flight is what latency-bound collectives want (scheduler/auto_knobs.h), so the tuner can reach it.
     {KnobScale::log_multiple, 1.0, 64.0, 1, "partition_bytes", true, true}},
    {"small_tensor_bytes", "small_tensor", &Knobs::small_tensor_bytes, &EngineConfig::small_tensor_set,
     "bytescheduler fuses queued tensors up to this size into one message (0: off; on all-reduce, 0 is automatic: "
     "two partitions)",
     // Off is the band below the smallest bound: the tuner learns whether fusing pays at all, next to fusing a little.
     // The top reaches the automatic all-reduce bound (two partitions) of the large partitions slow rings want.
     {KnobScale::log_bytes, 16.0 * 1024, 256.0 * 1024 * 1024, 4096, {}, false, false, true},
     ZeroSize::off},
};
inline constexpr size_t kKnobCount = std::size(kKnobs);

// The registration rules of a knob table, checked at compile time for kKnobs: a knob with a tuning scale has a
// Knobs field (else the tuner would search it and never apply it), and a name. Throws InvalidArgument naming the knob.
constexpr bool check_knob_registry(std::span<const KnobSpec> knobs) {
  for (const KnobSpec& k : knobs) {
    if (k.name.empty()) throw InvalidArgument("a registered knob has no name");
    if (k.tuning.scale != KnobScale::fixed && k.field == nullptr)
      throw InvalidArgument("knob '" + std::string(k.name) +
                            "' has a tuning scale but no Knobs field: the tuner would search it and never apply it "
                            "(add a field to Knobs, or register it as fixed)");
  }
  return true;
}
static_assert(check_knob_registry(kKnobs));

// The tuning row of a registered knob (constant-evaluated where the name is a literal); throws when none.
constexpr const KnobTuning& registered_tuning(std::string_view knob) {
  for (const KnobSpec& k : kKnobs)
    if (k.name == knob) return k.tuning;
  throw InvalidArgument("no registered knob is named '" + std::string(knob) + "'");
}

// The registry rows of EngineConfig.
const OptionTable<EngineConfig>& engine_option_table();

}  // namespace commsched
