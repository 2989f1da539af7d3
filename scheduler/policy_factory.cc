#include "scheduler/policy_factory.h"

#include "scheduler/fifo_policy.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {

std::unique_ptr<Policy> make_policy(const EngineConfig& config) {
  switch (config.policy) {
    case PolicyKind::bytescheduler:
      return std::make_unique<PriorityCreditPolicy>(config.knobs.credit_bytes, config.small_tensor_bytes);
    case PolicyKind::wfbp:
      return std::make_unique<FifoPolicy>();
    case PolicyKind::bsp:
    case PolicyKind::fusion:
    case PolicyKind::mgwfbp:
      break;
  }
  throw InvalidArgument("COMMSCHED_POLICY='" + std::string(policy_name(config.policy)) +
                        "' is not available in this build (allowed: bytescheduler, wfbp)");
}

}  // namespace commsched
