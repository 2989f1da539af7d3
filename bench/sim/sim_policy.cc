#include "bench/sim/sim_policy.h"

#include "scheduler/bsp_policy.h"
#include "scheduler/fusion_policy.h"
#include "scheduler/mg_wfbp_policy.h"
#include "scheduler/policy_factory.h"

namespace commsched::sim {

std::unique_ptr<Policy> make_sim_policy(EngineConfig config, const NetworkModel& network) {
  const CostModel cost = network.cost_model();
  config.mg_alpha_s = cost.alpha_s;
  config.mg_beta_s_per_byte = cost.beta_s_per_byte;
  // The engine's factory is the one place that maps a config to a policy. Until it knows the baselines, build those
  // here from the same config fields (same classes, same constructor arguments).
  switch (config.policy) {
    case PolicyKind::bsp:
      return std::make_unique<BspPolicy>();
    case PolicyKind::fusion:
      return std::make_unique<FusionPolicy>(config.fusion_bytes, static_cast<Nanos>(config.fusion_cycle_s * 1e9));
    case PolicyKind::mgwfbp:
      return std::make_unique<MergedGradientPolicy>(config.mg_alpha_s, config.mg_beta_s_per_byte);
    default:
      return make_policy(config);
  }
}

}  // namespace commsched::sim
