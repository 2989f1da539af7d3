// Engine configuration, filled from the option registry (options/option_table.h): engine_option_table() is the one
// list of COMMSCHED_* engine variables, their parsers, defaults and docs; set() and from_env() only apply its rows.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "compression/codec.h"
#include "options/knobs.h"
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
  Knobs knobs;                            // partition_bytes, credit_bytes, small_tensor_bytes (the knob set, options/knobs.h kKnobs)
  uint64_t fusion_bytes = 64ull << 20;    // fusion_bytes (fusion policy threshold)
  double fusion_cycle_s = 0.005;          // fusion_cycle (fusion policy cycle)
  bool credit_stall_guard = true;         // credit_stall_guard: see PriorityCreditPolicy
  std::string timeline_path;              // timeline (empty: off)
  uint64_t timeline_max_events = 1'000'000;  // timeline_max_events
  double mg_alpha_s = 50e-6;              // mg_alpha: per-message latency for MG-WFBP
  double mg_beta_s_per_byte = 8.0 / 10e9; // mg_bandwidth (rate) -> seconds per byte
  compression::Spec compression;          // compression: none, fp16, bf16, topk:RATIO, signsgd
  // Whether partition_bytes / credit_bytes / small_tensor_bytes were given (option or environment); the composition
  // root replaces the others by the automatic knobs for the cluster's shape (scheduler/auto_knobs.h). A knob the
  // automatic choice does not set needs no flag (config.cc given_flag).
  bool partition_set = false;
  bool credit_set = false;
  bool small_tensor_set = false;

  // Applies one option by name or alias ("policy", "partition_bytes", ...); throws InvalidArgument naming it.
  // `var` is what a bad value's error names (default: the environment variable; a CLI passes its flag).
  void set(std::string_view option, std::string_view value, std::string_view var = {});
  // Reads every COMMSCHED_* variable of engine_option_table(), and below them BytePS's BYTEPS_PARTITION_BYTES and
  // BYTEPS_SCHEDULING_CREDIT (in partitions) and Horovod's HOROVOD_TIMELINE.
  static EngineConfig from_env();
  // Checks cross-field consistency; throws InvalidArgument.
  void validate() const;
};

// The registry rows of EngineConfig.
const OptionTable<EngineConfig>& engine_option_table();

}  // namespace commsched
