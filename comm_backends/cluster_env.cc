#include "comm_backends/cluster_env.h"

#include <sstream>

#include "scheduler/config.h"
#include "scheduler/types.h"

namespace commsched {
namespace {

// Returns the first set variable among `names` together with its name.
std::optional<std::pair<std::string, std::string>> first_set(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto v = env_value(n)) return std::make_pair(std::string(n), *v);
  return std::nullopt;
}

}  // namespace

ClusterEnv ClusterEnv::from_env() {
  ClusterEnv e;
  if (auto v = first_set({"COMMSCHED_ROLE", "DMLC_ROLE"})) {
    if (v->second == "worker") e.role = Role::worker;
    else if (v->second == "server") e.role = Role::server;
    else throw InvalidArgument(v->first + "='" + v->second + "' is invalid: one of worker, server");
  }
  if (auto v = first_set({"COMMSCHED_NUM_WORKERS", "DMLC_NUM_WORKER", "WORLD_SIZE"}))
    e.num_workers = static_cast<int>(parse_int(v->first, v->second, 1, 1 << 20));
  if (auto v = first_set({"COMMSCHED_NUM_SERVERS", "DMLC_NUM_SERVER"}))
    e.num_servers = static_cast<int>(parse_int(v->first, v->second, 0, 1 << 20));
  const bool server = e.role == Role::server;
  std::string rank_var = "COMMSCHED_RANK";
  if (auto v = server ? first_set({"COMMSCHED_RANK", "DMLC_SERVER_ID"}) : first_set({"COMMSCHED_RANK", "DMLC_WORKER_ID", "RANK"})) {
    e.rank = static_cast<int>(parse_int(v->first, v->second, 0, 1 << 20));
    rank_var = v->first;
  }
  if (auto v = first_set({"COMMSCHED_ROOT_ADDR", "DMLC_PS_ROOT_URI", "MASTER_ADDR"})) e.root_addr = v->second;
  if (auto v = first_set({"COMMSCHED_ROOT_PORT", "DMLC_PS_ROOT_PORT"})) {
    e.root_port = static_cast<int>(parse_int(v->first, v->second, 1, 65535));
  } else if (auto m = first_set({"MASTER_PORT"})) {
    // torchrun's agent (and torch.distributed's env:// rank 0) listens on MASTER_PORT itself; ours is the next one.
    e.root_port = static_cast<int>(parse_int(m->first, m->second, 1, 65534)) + 1;
  }
  if (auto v = first_set({"COMMSCHED_BIND", "DMLC_INTERFACE"})) e.bind = v->second;
  e.local_rank = e.rank;
  e.local_size = e.num_workers;
  if (auto v = first_set({"COMMSCHED_LOCAL_RANK", "LOCAL_RANK"}))
    e.local_rank = static_cast<int>(parse_int(v->first, v->second, 0, 1 << 20));
  if (auto v = first_set({"COMMSCHED_LOCAL_SIZE", "LOCAL_WORLD_SIZE"})) e.local_size = static_cast<int>(parse_int(v->first, v->second, 1, 1 << 20));
  if (auto v = first_set({"COMMSCHED_TIMEOUT"})) e.timeout_s = parse_seconds(v->first, v->second);
  const int n = server ? e.num_servers : e.num_workers;
  if (e.rank >= n)  // named after the variable it came from (RANK under torchrun)
    throw InvalidArgument(rank_var + "=" + std::to_string(e.rank) + " is invalid: a " + (server ? "server" : "worker") +
                          " rank must be in [0, " + std::to_string(n) + ")");
  e.validate();
  return e;
}

void ClusterEnv::validate() const {
  const int n = role == Role::server ? num_servers : num_workers;
  if (rank < 0 || rank >= n) {
    std::ostringstream os;
    os << "COMMSCHED_RANK=" << rank << " is invalid: a " << (role == Role::server ? "server" : "worker")
       << " rank must be in [0, " << n << ")";
    throw InvalidArgument(os.str());
  }
  if (local_rank < 0 || local_rank >= local_size)
    throw InvalidArgument("COMMSCHED_LOCAL_RANK=" + std::to_string(local_rank) + " is invalid: must be in [0, " +
                          std::to_string(local_size) + ")");
  if (timeout_s <= 0) throw InvalidArgument("COMMSCHED_TIMEOUT must be positive");
}

std::string ClusterEnv::describe() const {
  std::ostringstream os;
  os << (role == Role::server ? "server " : "worker ") << rank << " of " << (role == Role::server ? num_servers : num_workers)
     << " (workers=" << num_workers << ", servers=" << num_servers << ", root=" << root_addr << ':' << root_port << ')';
  return os.str();
}

}  // namespace commsched
