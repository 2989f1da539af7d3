// Configuration: the one place that parses and validates COMMSCHED_* variables and explicit options.
// Each value parser names the variable, the value and what is allowed when it rejects input.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "scheduler/policy.h"

namespace commsched {

// ---- value parsers (shared by every component's config) ----
// Sizes: "4MiB", "512KiB", "1.5MB", "4096", "4k". Binary (KiB) and decimal (KB) units; bare numbers are bytes.
// When allow_unlimited, "inf", "unlimited" and "none" give 0 (meaning no limit). Zero and negative sizes are rejected.
uint64_t parse_bytes(std::string_view var, std::string_view value, bool allow_unlimited = false);
// Link rates in bits per second: "10Gbit", "1gbps", "100Mbit", "25G"; "inf"/"0" = unlimited (0) when allowed.
double parse_rate_bps(std::string_view var, std::string_view value, bool allow_unlimited = false);
// Durations in seconds: "5us", "1.5ms", "2s", "250ns"; a bare number is seconds.
double parse_seconds(std::string_view var, std::string_view value);
int64_t parse_int(std::string_view var, std::string_view value, int64_t min, int64_t max);
double parse_double(std::string_view var, std::string_view value, double min, double max);
bool parse_bool(std::string_view var, std::string_view value);
// Human-readable size ("4 MiB") for logs and tables.
std::string format_bytes(uint64_t bytes);

// Reads an environment variable; nullopt when unset or empty.
std::optional<std::string> env_value(const std::string& name);

enum class PolicyKind { bytescheduler, wfbp, bsp, fusion, mgwfbp };
std::string_view policy_name(PolicyKind p);
PolicyKind parse_policy(std::string_view var, std::string_view value);

// Engine configuration. Variable names (environment) in comments; explicit options use the same name in lower case
// without the prefix (e.g. "partition_bytes").
struct EngineConfig {
  PolicyKind policy = PolicyKind::bytescheduler;  // COMMSCHED_POLICY
  Knobs knobs;                                      // COMMSCHED_PARTITION_BYTES, COMMSCHED_CREDIT_BYTES
  uint64_t fusion_bytes = 64ull << 20;              // COMMSCHED_FUSION_BYTES (fusion policy threshold)
  double fusion_cycle_s = 0.005;                    // COMMSCHED_FUSION_CYCLE (fusion policy cycle)
  uint64_t small_tensor_bytes = 0;                  // COMMSCHED_SMALL_TENSOR_BYTES: bytescheduler fuses below (0: off)
  bool credit_stall_guard = true;                   // COMMSCHED_CREDIT_STALL_GUARD: see PriorityCreditPolicy
  std::string timeline_path;                        // COMMSCHED_TIMELINE (empty: off)
  uint64_t timeline_max_events = 1'000'000;         // COMMSCHED_TIMELINE_MAX_EVENTS
  double mg_alpha_s = 50e-6;                        // COMMSCHED_MG_ALPHA: per-message latency for MG-WFBP
  double mg_beta_s_per_byte = 8.0 / 10e9;           // COMMSCHED_MG_BANDWIDTH (rate) -> seconds per byte
  // Whether partition_bytes / credit_bytes were given (option or environment); the composition root replaces the
  // others by the automatic knobs for the cluster's shape (scheduler/auto_knobs.h).
  bool partition_set = false;
  bool credit_set = false;

  // Applies one option by name ("policy", "partition_bytes", ...); throws InvalidArgument naming it.
  void set(std::string_view option, std::string_view value);
  // Reads every COMMSCHED_* variable this struct knows.
  static EngineConfig from_env();
  // Checks cross-field consistency; throws InvalidArgument.
  void validate() const;
};

}  // namespace commsched
