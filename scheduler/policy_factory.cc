#include "scheduler/policy_factory.h"

#include <cctype>
#include <cmath>

#include "scheduler/bsp_policy.h"
#include "scheduler/fifo_policy.h"
#include "scheduler/fusion_policy.h"
#include "scheduler/mg_wfbp_policy.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

// The registrations: one row per policy. The only place that names every concrete policy type.
const std::vector<PolicyInfo>& registrations() {
  static const std::vector<PolicyInfo> rows = {
      {"bytescheduler", {"priority", "priority_credit"},
       "priority + credit (ByteScheduler): partitions, most urgent layer first, bounded bytes in flight",
       false, {"partition_bytes", "credit_bytes", "small_tensor_bytes", "credit_stall_guard"},
       [](const EngineConfig& c) -> std::unique_ptr<Policy> {
         return std::make_unique<PriorityCreditPolicy>(c.knobs.credit_bytes, c.small_tensor_bytes, c.credit_stall_guard);
       },
       /*baseline=*/false},
      {"wfbp", {"fifo"}, "wait-free backpropagation: whole tensors in the order backward produces them", false, {},
       [](const EngineConfig&) -> std::unique_ptr<Policy> { return std::make_unique<FifoPolicy>(); }},
      {"bsp", {}, "bulk synchronous: every tensor after the end of backward", true, {},
       [](const EngineConfig&) -> std::unique_ptr<Policy> { return std::make_unique<BspPolicy>(); }},
      {"fusion", {"horovod"}, "tensor fusion (Horovod): tensors fused up to a size, flushed every cycle", false,
       {"fusion_bytes", "fusion_cycle"},
       [](const EngineConfig& c) -> std::unique_ptr<Policy> {
         return std::make_unique<FusionPolicy>(c.fusion_bytes, static_cast<Nanos>(std::llround(c.fusion_cycle_s * 1e9)));
       }},
      {"mgwfbp", {"mg-wfbp", "mg_wfbp", "merged"},
       "merged-gradient WFBP: merges layers by a latency/bandwidth cost model learned from the first backward", true,
       {"mg_alpha", "mg_bandwidth"},
       [](const EngineConfig& c) -> std::unique_ptr<Policy> {
         return std::make_unique<MergedGradientPolicy>(c.mg_alpha_s, c.mg_beta_s_per_byte);
       }},
  };
  return rows;
}

std::string normalized(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::span<const PolicyInfo> policy_registry() { return registrations(); }

const PolicyInfo* find_policy(std::string_view name_or_alias) {
  const std::string key = normalized(name_or_alias);
  for (const PolicyInfo& p : registrations()) {
    if (key == p.name) return &p;
    for (std::string_view a : p.aliases)
      if (key == a) return &p;
  }
  return nullptr;
}

const PolicyInfo& policy_info(PolicyKind kind) {
  if (const PolicyInfo* p = find_policy(kind.name())) return *p;
  throw InvalidArgument("policy '" + std::string(kind.name()) + "' is not registered (registered: " +
                        join_names(policy_names()) + ")");
}

std::vector<std::string> policy_names() {
  std::vector<std::string> out;
  for (const PolicyInfo& p : registrations()) out.emplace_back(p.name);
  return out;
}

std::vector<PolicyKind> all_policies() {
  std::vector<PolicyKind> out;
  for (const PolicyInfo& p : registrations()) out.emplace_back(p.name);
  return out;
}

std::unique_ptr<Policy> make_policy(const EngineConfig& config) { return policy_info(config.policy).make(config); }

}  // namespace commsched
