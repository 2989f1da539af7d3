#include "plugins/launch/run_keys.h"

#include "comm_backends/cluster_auth.h"
#include "scheduler/config.h"

namespace commsched {

std::map<std::string, std::string> run_auth_env() {
  const ClusterAuth inherited = ClusterAuth::from_env();  // validates what the caller set, naming the culprit
  if (inherited.mode == ClusterAuth::Mode::off || !inherited.secret.empty()) return {};
  return {{"COMMSCHED_SECRET", ClusterAuth::generate_secret()}};
}

}  // namespace commsched
