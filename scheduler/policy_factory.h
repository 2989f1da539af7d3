// Builds the Policy an EngineConfig asks for. The only place that names every concrete policy.
#pragma once

#include <memory>

#include "scheduler/config.h"
#include "scheduler/policy.h"

namespace commsched {

std::unique_ptr<Policy> make_policy(const EngineConfig& config);

}  // namespace commsched
