// Builds the real Policy object an EngineConfig names, for a simulated network.
#pragma once

#include <memory>

#include "simulator/network.h"
#include "scheduler/config.h"
#include "scheduler/policy.h"

namespace commsched::sim {

// MG-WFBP plans with the simulated network's own alpha/beta (as its paper measures them on the real network); the
// other policies take the config as the engine would. With symmetric workers (one simulated for all) the credit stall
// guard is off: the cross-worker deadlock it breaks cannot happen there, and it would only blur the policy measured.
// Workers simulated one by one keep it as configured, as the engine does.
std::unique_ptr<Policy> make_sim_policy(EngineConfig config, const NetworkModel& network, bool symmetric_workers = true);

}  // namespace commsched::sim
