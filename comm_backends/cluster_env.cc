#include "comm_backends/cluster_env.h"

#include <algorithm>
#include <sstream>

#include "scheduler/config.h"
#include "scheduler/types.h"

namespace commsched {
namespace {

ValueType<Role> role_value() {
  const ValueType<std::string> choice = choice_value({"worker", "server"});
  return {choice.type, choice.allowed,
          [parse = choice.parse](std::string_view var, std::string_view value) {
            return parse(var, value) == "server" ? Role::server : Role::worker;
          },
          [](const Role& r) { return std::string(r == Role::server ? "server" : "worker"); }};
}

OptionTable<ClusterEnv> build_cluster_table() {
  using E = ClusterEnv;
  constexpr int64_t kMany = 1 << 20;
  OptionTable<E> t("cluster", "cluster");
  t.bind("role", "COMMSCHED_ROLE", [](E& e) -> Role& { return e.role; }, role_value(),
         "this process's role (also DMLC_ROLE)");
  t.bind("num_workers", "COMMSCHED_NUM_WORKERS", [](E& e) -> int& { return e.num_workers; }, int_value(1, kMany),
         "worker processes (also DMLC_NUM_WORKER, torchrun's WORLD_SIZE)");
  t.bind("num_servers", "COMMSCHED_NUM_SERVERS", [](E& e) -> int& { return e.num_servers; }, int_value(0, kMany),
         "parameter-server processes (also DMLC_NUM_SERVER)");
  t.bind("rank", "COMMSCHED_RANK", [](E& e) -> int& { return e.rank; }, int_value(0, kMany),
         "this process's rank within its role, below the number of its role's processes (also DMLC_WORKER_ID or "
         "torchrun's RANK for workers, DMLC_SERVER_ID for servers)");
  t.bind("root_addr", "COMMSCHED_ROOT_ADDR", [](E& e) -> std::string& { return e.root_addr; },
         text_value("a host name or address"), "address of the rendezvous root (also DMLC_PS_ROOT_URI, MASTER_ADDR)");
  t.bind("root_port", "COMMSCHED_ROOT_PORT", [](E& e) -> int& { return e.root_port; }, int_value(1, 65535),
         "port of the rendezvous root (also DMLC_PS_ROOT_PORT; under torchrun MASTER_PORT + 1, since torchrun's "
         "store holds MASTER_PORT)");
  t.bind("bind", "COMMSCHED_BIND", [](E& e) -> std::string& { return e.bind; },
         text_value("an address or interface name; empty: automatic"),
         "where data sockets bind (also DMLC_INTERFACE); empty: the address this host uses to reach the root");
  t.bind("local_rank", "COMMSCHED_LOCAL_RANK", [](E& e) -> int& { return e.local_rank; }, int_value(0, kMany),
         "position among the workers of this host, below local_size (also LOCAL_RANK); unset: the rank");
  t.bind("local_size", "COMMSCHED_LOCAL_SIZE", [](E& e) -> int& { return e.local_size; }, int_value(1, kMany),
         "workers on this host (also LOCAL_WORLD_SIZE); unset: every worker");
  t.bind("timeout", "COMMSCHED_TIMEOUT", [](E& e) -> double& { return e.timeout_s; }, duration_value(),
         "silence from a peer before it is declared dead (positive; with heartbeats and polling a hung peer is caught "
         "within 10 s of the default; raise it on a congested fabric, where TCP can stall a flow for seconds)");
  return t;
}

// Returns the first set variable among `names` together with its name.
std::optional<std::pair<std::string, std::string>> first_set(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto v = env_value(n)) return std::make_pair(std::string(n), *v);
  return std::nullopt;
}

// Applies the cluster option `option` from its own variable (COMMSCHED_*) or else the first set one of `older`
// (DMLC_*, then torchrun's), parsed and checked by its registry row; returns the variable used, empty when none.
std::string apply_first_set(ClusterEnv& e, std::string_view option, std::initializer_list<const char*> older) {
  std::optional<std::pair<std::string, std::string>> v;
  for (const OptionInfo& info : cluster_option_table().infos())
    if (info.name == option)
      if (auto own = env_value(info.env)) v = std::make_pair(info.env, *own);
  if (!v) v = first_set(older);
  if (!v) return {};
  cluster_option_table().set(e, option, v->second, v->first);
  return v->first;
}

}  // namespace

const OptionTable<ClusterEnv>& cluster_option_table() {
  static const OptionTable<ClusterEnv> table = build_cluster_table();
  return table;
}

ClusterEnv ClusterEnv::from_env() {
  ClusterEnv e;
  apply_first_set(e, "role", {"DMLC_ROLE"});
  apply_first_set(e, "num_workers", {"DMLC_NUM_WORKER", "WORLD_SIZE"});
  apply_first_set(e, "num_servers", {"DMLC_NUM_SERVER"});
  const bool server = e.role == Role::server;
  std::string rank_var = server ? apply_first_set(e, "rank", {"DMLC_SERVER_ID"})
                                : apply_first_set(e, "rank", {"DMLC_WORKER_ID", "RANK"});
  if (rank_var.empty()) rank_var = "COMMSCHED_RANK";
  apply_first_set(e, "root_addr", {"DMLC_PS_ROOT_URI", "MASTER_ADDR"});
  if (apply_first_set(e, "root_port", {"DMLC_PS_ROOT_PORT"}).empty()) {
    if (auto m = first_set({"MASTER_PORT"})) {
      // torchrun's agent (and torch.distributed's env:// rank 0) listens on MASTER_PORT itself; ours is the next one.
      e.root_port = static_cast<int>(parse_int(m->first, m->second, 1, 65534)) + 1;
    }
  }
  apply_first_set(e, "bind", {"DMLC_INTERFACE"});
  const int n = server ? e.num_servers : e.num_workers;
  // Unset, a process is alone with the others of its role on one host: a server's defaults are server-shaped, so a
  // server started by hand with only its role and rank is valid.
  e.local_rank = e.rank;
  e.local_size = std::max(n, 1);
  std::string local_var = apply_first_set(e, "local_rank", {"LOCAL_RANK"});
  const std::string size_var = apply_first_set(e, "local_size", {"LOCAL_WORLD_SIZE"});
  apply_first_set(e, "timeout", {});
  if (e.rank >= n)  // named after the variable it came from (RANK under torchrun)
    throw InvalidArgument(rank_var + "=" + std::to_string(e.rank) + " is invalid: a " + (server ? "server" : "worker") +
                          " rank must be in [0, " + std::to_string(n) + ")");
  if (e.local_rank >= e.local_size)  // named after the variables it came from, or the defaults it fell back to
    throw InvalidArgument((local_var.empty() ? "the local rank (default: " + rank_var + ")" : local_var) + "=" +
                          std::to_string(e.local_rank) + " is invalid: must be below the local size " +
                          std::to_string(e.local_size) + " (" +
                          (size_var.empty() ? std::string("default: the number of ") + (server ? "servers" : "workers")
                                            : size_var) +
                          ")");
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
