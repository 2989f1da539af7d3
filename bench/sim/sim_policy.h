// Builds the real Policy object an EngineConfig names, for a simulated network.
#pragma once

#include <memory>

#include "bench/sim/network.h"
#include "scheduler/config.h"
#include "scheduler/policy.h"

namespace commsched::sim {

// MG-WFBP plans with the simulated network's own alpha/beta (as its paper measures them on the real network); the
// other policies take the config as the engine would.
std::unique_ptr<Policy> make_sim_policy(EngineConfig config, const NetworkModel& network);

}  // namespace commsched::sim
