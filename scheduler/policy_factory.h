// The policy registry: every scheduling policy, its aliases, properties and factory, in one table. Everything that
// lists, parses or builds policies (engine options, CLI flags, the simulator's grid, the tuner, Python's flush rule)
// reads it; adding a policy is its own file (a Policy subclass) plus one row in policy_factory.cc.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/config.h"
#include "scheduler/policy.h"

namespace commsched {

struct PolicyInfo {
  std::string_view name;                  // canonical name (PolicyKind, result tables, timelines)
  std::vector<std::string_view> aliases;  // other names parse_policy accepts
  std::string_view description;
  // Holds tasks until the end of backward (Engine::backward_done; MG-WFBP once it has learned its merge groups from
  // one): a caller submitting outside a backward (eager broadcasts, metric all-reduces) must flush() them.
  bool holds_tasks = false;
  // The engine options this policy reads (EngineConfig); what the simulator's grid and the tuner may vary for it.
  std::vector<std::string_view> options;
  std::unique_ptr<Policy> (*make)(const EngineConfig&) = nullptr;
  // A baseline the scheduler is compared against (WFBP, BSP, fusion, MG-WFBP); false for the scheduler itself. The
  // simulator's targets (simulator/report.h) judge the non-baseline rows against the best baseline row by this.
  bool baseline = true;
};

// Every registered policy, in listing order (the default comparison order of `commsched bench`).
std::span<const PolicyInfo> policy_registry();
// By name or alias (case-insensitive, surrounding blanks ignored); nullptr when none.
const PolicyInfo* find_policy(std::string_view name_or_alias);
// The registry row of a PolicyKind; throws InvalidArgument when it names no registered policy.
const PolicyInfo& policy_info(PolicyKind kind);
// Canonical names, in registry order.
std::vector<std::string> policy_names();
// Every registered policy as a PolicyKind, in registry order.
std::vector<PolicyKind> all_policies();

// Builds the Policy an EngineConfig asks for.
std::unique_ptr<Policy> make_policy(const EngineConfig& config);

}  // namespace commsched
