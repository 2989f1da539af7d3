#include "bench/sim/sim_policy.h"

#include "scheduler/policy_factory.h"

namespace commsched::sim {

std::unique_ptr<Policy> make_sim_policy(EngineConfig config, const NetworkModel& network) {
  const CostModel cost = network.cost_model();
  config.mg_alpha_s = cost.alpha_s;
  config.mg_beta_s_per_byte = cost.beta_s_per_byte;
  // Simulated workers are identical and send in the same order, so the cross-worker credit deadlock the stall guard
  // breaks cannot happen here; the guard would only blur the policy being measured.
  config.credit_stall_guard = false;
  return make_policy(config);
}

}  // namespace commsched::sim
