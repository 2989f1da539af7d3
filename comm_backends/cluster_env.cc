#include "comm_backends/cluster_env.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "comm_backends/launcher_env.h"
#include "scheduler/config.h"
#include "base/types.h"

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
         "worker processes (a worker's launcher: WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE; also DMLC_NUM_WORKER)");
  t.bind("num_servers", "COMMSCHED_NUM_SERVERS", [](E& e) -> int& { return e.num_servers; }, int_value(0, kMany),
         "parameter-server processes (a server's launcher: as num_workers; also DMLC_NUM_SERVER)");
  t.bind("rank", "COMMSCHED_RANK", [](E& e) -> int& { return e.rank; }, int_value(0, kMany),
         "this process's rank within its role, below the number of its role's processes (launchers: RANK, "
         "SLURM_PROCID, OMPI_COMM_WORLD_RANK; also DMLC_WORKER_ID / DMLC_SERVER_ID). Precedence: COMMSCHED_* > "
         "torchrun/Ray > Slurm > Open MPI > DMLC_*; two launchers that disagree are an error naming both");
  t.bind("root_addr", "COMMSCHED_ROOT_ADDR", [](E& e) -> std::string& { return e.root_addr; },
         text_value("a host name or address"), "address of the rendezvous root (launchers: MASTER_ADDR, the first host of SLURM_JOB_NODELIST, "
         "loopback under a one-host mpirun; also DMLC_PS_ROOT_URI)");
  t.bind("root_port", "COMMSCHED_ROOT_PORT", [](E& e) -> int& { return e.root_port; }, int_value(1, 65535),
         "port of the rendezvous root (under torchrun/Ray MASTER_PORT + 1, since torchrun's store holds "
         "MASTER_PORT; under Slurm and Open MPI 10000 + 4 * (job id mod 5000), the job id from SLURM_JOB_ID or "
         "OMPI_MCA_ess_base_jobid; also DMLC_PS_ROOT_PORT)");
  t.bind("bind", "COMMSCHED_BIND", [](E& e) -> std::string& { return e.bind; },
         text_value("an address or interface name; empty: automatic"),
         "where data sockets bind (also DMLC_INTERFACE); empty: the address this host uses to reach the root");
  t.bind("local_rank", "COMMSCHED_LOCAL_RANK", [](E& e) -> int& { return e.local_rank; }, int_value(0, kMany),
         "position among the workers of this host, below local_size (launchers: LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK); unset: the rank");
  t.bind("local_size", "COMMSCHED_LOCAL_SIZE", [](E& e) -> int& { return e.local_size; }, int_value(1, kMany),
         "workers on this host (launchers: LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE or this node's SLURM_TASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE); unset: every worker");
  t.bind("timeout", "COMMSCHED_TIMEOUT", [](E& e) -> double& { return e.timeout_s; }, duration_value(),
         "silence from a peer before it is declared dead (positive; with heartbeats and polling a hung peer is caught "
         "within 10 s of the default; raise it on a congested fabric, where TCP can stall a flow for seconds)");
  t.bind("generation", "COMMSCHED_GENERATION", [](E& e) -> int& { return e.generation; }, int_value(0, kMany),
         "which membership of an elastic job this is (torchrun: TORCHELASTIC_RESTART_COUNT); part of every "
         "rendezvous key, so a re-formed group never reads an earlier one's");
  t.bind("min_workers", "COMMSCHED_MIN_WORKERS", [](E& e) -> int& { return e.min_workers; }, int_value(0, kMany),
         "elastic training: below this many workers every process exits with an error (0: not elastic; "
         "`commsched launch --min-workers` sets it)");
  t.bind("max_workers", "COMMSCHED_MAX_WORKERS", [](E& e) -> int& { return e.max_workers; }, int_value(0, kMany),
         "elastic training: at most this many workers; later joiners wait for a place (0: no bound)");
  t.bind("elastic_store", "COMMSCHED_ELASTIC_STORE", [](E& e) -> std::string& { return e.elastic_store; },
         text_value("HOST:PORT; empty: none"),
         "elastic training: the membership store that outlives every worker (`commsched launch --min-workers` "
         "serves one); without it a lost worker ends the job");
  return t;
}

// Where each field of a resolved ClusterEnv came from, for `commsched env`.
struct Trace {
  std::vector<std::string> launchers;                       // detected, highest precedence first
  std::vector<std::pair<std::string, std::string>> fields;  // option name -> source in words
  std::vector<std::string> notes;
};

std::string env_of(const std::string& option) {
  for (const OptionInfo& info : cluster_option_table().infos())
    if (info.name == option) return info.env;
  return option;
}

bool counts_processes(const std::string& option) {
  return option == "rank" || option == "num_workers" || option == "num_servers" || option == "local_rank" ||
         option == "local_size";
}

std::string source_words(const LauncherSetting& s, const std::string& launcher) {
  return s.value + "  (" + launcher + ": " + (s.how.empty() ? s.var : s.how) + ")";
}

// Two launchers both count this process (srun around a script that mpirun also started, ...): unless their counts
// agree, which one is right is the user's call.
void check_agreement(const std::string& option, const std::vector<LauncherView>& views) {
  const LauncherView* first = nullptr;
  for (const LauncherView& v : views) {
    auto it = v.fields.find(option);
    if (it == v.fields.end()) continue;
    if (!first) {
      first = &v;
      continue;
    }
    const LauncherSetting& a = first->fields.at(option);
    const LauncherSetting& b = it->second;
    if (parse_int(a.var, a.value, 0, int64_t{1} << 40) == parse_int(b.var, b.value, 0, int64_t{1} << 40)) continue;
    throw InvalidArgument(a.var + "=" + a.value + " (" + first->launcher + ") and " + b.var + "=" + b.value + " (" +
                          v.launcher + ") disagree on " + option + ": two launchers' variables are set; set " +
                          env_of(option) + " to choose, or start this process with one launcher");
  }
}

// Role first (COMMSCHED_ROLE, else DMLC_ROLE): a launcher's rank and size count the processes of this role.
void apply_role(ClusterEnv& e, Trace& t) {
  for (const char* var : {"COMMSCHED_ROLE", "DMLC_ROLE"})
    if (auto v = env_value(var)) {
      if (*v == "scheduler" && std::string(var) == "DMLC_ROLE")  // entry points exit 0 on it before (see header)
        throw InvalidArgument(scheduler_role_notice());
      cluster_option_table().set(e, "role", *v, var);
      t.fields.emplace_back("role", *v + "  (" + var + ")");
      return;
    }
}

// Unset local fields: the process is alone with the others of its role on one host (a server's defaults are
// server-shaped, so a server started by hand with only its role and rank is valid). Errors name the variable a value
// came from (RANK under torchrun, SLURM_PROCID under srun).
void check_ranks(ClusterEnv& e, const std::map<std::string, std::string>& var_of) {
  const bool server = e.role == Role::server;
  const int n = server ? e.num_servers : e.num_workers;
  auto var = [&](const char* option) {
    auto it = var_of.find(option);
    return it == var_of.end() ? std::string() : it->second;
  };
  const std::string rank_var = var("rank").empty() ? "COMMSCHED_RANK" : var("rank");
  if (var("local_rank").empty()) e.local_rank = e.rank;
  if (var("local_size").empty()) e.local_size = std::max(n, 1);
  if (e.rank >= n)
    throw InvalidArgument(rank_var + "=" + std::to_string(e.rank) + " is invalid: a " + (server ? "server" : "worker") +
                          " rank must be in [0, " + std::to_string(n) + ")");
  if (e.local_rank >= e.local_size)
    throw InvalidArgument(
        (var("local_rank").empty() ? "the local rank (default: " + rank_var + ")" : var("local_rank")) + "=" +
        std::to_string(e.local_rank) + " is invalid: must be below the local size " + std::to_string(e.local_size) +
        " (" +
        (var("local_size").empty() ? std::string("default: the number of ") + (server ? "servers" : "workers")
                                   : var("local_size")) +
        ")");
  e.validate();
}

ClusterEnv resolve(Trace& t) {
  ClusterEnv e;
  apply_role(e, t);
  const bool server = e.role == Role::server;
  std::vector<LauncherView> views = launcher_views(server);
  // torchrun's agent or a Ray node under srun or mpirun: their variables count the parents, not this process.
  if (!views.empty() && !views.front().parent.empty()) {
    const std::string parent = views.front().parent;
    auto outer = [](const LauncherView& v) { return v.launcher == "Slurm" || v.launcher == "Open MPI"; };
    for (size_t i = 1; i < views.size(); ++i)
      if (outer(views[i])) t.notes.push_back(views[i].launcher + "'s variables ignored: they describe " + parent);
    views.erase(std::remove_if(views.begin() + 1, views.end(), outer), views.end());
  }
  for (const LauncherView& v : views) {
    t.launchers.push_back(v.launcher);
    for (const std::string& n : v.notes) t.notes.push_back(v.launcher + ": " + n);
  }
  std::map<std::string, std::string> var_of;  // option -> the variable it came from
  for (const OptionInfo& info : cluster_option_table().infos()) {
    if (info.name == "role") continue;
    if (auto own = env_value(info.env)) {
      cluster_option_table().set(e, info.name, *own, info.env);
      var_of[info.name] = info.env;
      t.fields.emplace_back(info.name, *own + "  (" + info.env + ")");
      continue;
    }
    if (counts_processes(info.name)) check_agreement(info.name, views);
    for (const LauncherView& v : views) {
      auto it = v.fields.find(info.name);
      if (it == v.fields.end()) continue;
      cluster_option_table().set(e, info.name, it->second.value, it->second.var);
      var_of[info.name] = it->second.var;
      t.fields.emplace_back(info.name, source_words(it->second, v.launcher));
      break;
    }
  }
  if (!var_of.count("root_addr"))
    for (const LauncherView& v : views)
      if (!v.missing_root.empty()) throw InvalidArgument(v.missing_root);
  check_ranks(e, var_of);
  return e;
}
}  // namespace

const OptionTable<ClusterEnv>& cluster_option_table() {
  static const OptionTable<ClusterEnv> table = build_cluster_table();
  return table;
}

ClusterEnv ClusterEnv::from_env() {
  Trace t;
  return resolve(t);
}

std::string ClusterEnv::explain_env() {
  Trace t;
  const ClusterEnv e = resolve(t);
  std::ostringstream os;
  os << "launcher: " << (t.launchers.empty() ? std::string("none (COMMSCHED_* and defaults)") : t.launchers.front());
  for (size_t i = 1; i < t.launchers.size(); ++i) os << (i == 1 ? "; also set: " : ", ") << t.launchers[i];
  os << "\n";
  for (const std::string& n : t.notes) os << "note: " << n << "\n";
  for (const auto& [name, source] : t.fields) os << "  " << name << " = " << source << "\n";
  os << "derived: " << e.describe() << ", local rank " << e.local_rank << " of " << e.local_size << "\n";
  return os.str();
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
  if (!store_scope.empty() && num_servers > 0)
    throw InvalidArgument("store_scope '" + store_scope + "' is for a process set's sub-cluster, which has no servers (" +
                          std::to_string(num_servers) + " given)");
  if (max_workers > 0 && min_workers > max_workers)
    throw InvalidArgument("COMMSCHED_MIN_WORKERS=" + std::to_string(min_workers) + " is above COMMSCHED_MAX_WORKERS=" +
                          std::to_string(max_workers));
}

std::string ClusterEnv::describe() const {
  std::ostringstream os;
  os << (role == Role::server ? "server " : "worker ") << rank << " of " << (role == Role::server ? num_servers : num_workers)
     << " (workers=" << num_workers << ", servers=" << num_servers << ", root=" << root_addr << ':' << root_port << ')';
  return os.str();
}

}  // namespace commsched
