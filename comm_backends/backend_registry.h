// The backend registry: which backends this build has and how each is made. Apart from the interface
// (comm_backend.h, which includes no backend), so that the engine's side of the interface does not pull every backend.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/comm_backend.h"

namespace commsched {

struct ClusterEnv;
struct EngineConfig;

// The backend registry: every backend, whether this build carries it, what it moves and its factory. The composition
// root (plugins/api), the option registry (COMMSCHED_BACKEND's allowed values) and Python's *_built() read it; a new
// backend is its own folder plus one row in backend_registry.cc.
struct BackendInfo {
  std::string_view name;         // COMMSCHED_BACKEND's value
  std::string_view description;
  bool available = false;        // built into this build
  std::string_view missing;      // when not available: what to install and rebuild
  std::vector<Op> ops;           // operations it carries (every one on every device below)
  std::vector<Device> devices;   // buffers it carries
  // ops x devices, as CommBackend::capabilities() hands it on (and CommBackend::supports answers from it).
  OpDeviceSet row() const { return OpDeviceSet(ops, devices); }
  bool carries(Op op, Device device) const { return row().has(op, device); }
  // Connects this process (blocks for the rendezvous); throws InvalidArgument when the cluster does not fit it or the
  // build lacks it. `engine` is the engines' config: a collective backend's rank 0 runs the same policy over every
  // rank's ready partitions.
  std::shared_ptr<CommBackend> (*make)(const ClusterEnv& env, const EngineConfig& engine) = nullptr;
};

std::span<const BackendInfo> backend_registry();
// nullptr when no backend has this name.
const BackendInfo* find_backend(std::string_view name);
std::vector<std::string> backend_names();

}  // namespace commsched
