#include "simulator/sim_policy.h"

#include "scheduler/policy_factory.h"

namespace commsched::sim {

std::unique_ptr<Policy> make_sim_policy(EngineConfig config, const NetworkModel& network, bool symmetric_workers) {
  const CostModel cost = network.cost_model();
  config.mg_alpha_s = cost.alpha_s;
  config.mg_beta_s_per_byte = cost.beta_s_per_byte;
  if (symmetric_workers) config.credit_stall_guard = false;
  return make_policy(config);
}

}  // namespace commsched::sim
