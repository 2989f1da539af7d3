#include "scheduler/policy_factory.h"

#include <cmath>

#include "scheduler/bsp_policy.h"
#include "scheduler/fifo_policy.h"
#include "scheduler/fusion_policy.h"
#include "scheduler/mg_wfbp_policy.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {

std::unique_ptr<Policy> make_policy(const EngineConfig& config) {
  switch (config.policy) {
    case PolicyKind::bytescheduler:
      return std::make_unique<PriorityCreditPolicy>(config.knobs.credit_bytes, config.small_tensor_bytes,
                                                    config.credit_stall_guard);
    case PolicyKind::wfbp:
      return std::make_unique<FifoPolicy>();
    case PolicyKind::bsp:
      return std::make_unique<BspPolicy>();
    case PolicyKind::fusion:
      return std::make_unique<FusionPolicy>(config.fusion_bytes, static_cast<Nanos>(std::llround(config.fusion_cycle_s * 1e9)));
    case PolicyKind::mgwfbp:
      return std::make_unique<MergedGradientPolicy>(config.mg_alpha_s, config.mg_beta_s_per_byte);
  }
  throw InvalidArgument("unknown policy value " + std::to_string(static_cast<int>(config.policy)));
}

}  // namespace commsched
