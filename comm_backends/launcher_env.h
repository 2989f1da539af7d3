// What each launcher's environment says about this process: torchrun (and Ray Train, which sets torchrun's
// variables), Slurm's srun, Open MPI's mpirun and BytePS's DMLC_*. Each view maps contract fields (the cluster
// registry's option names: rank, num_workers, ...) to a value and the variable it came from; ClusterEnv::from_env()
// (cluster_env.cc) applies them in one precedence order: explicit COMMSCHED_* > torchrun/Ray > Slurm > Open MPI >
// DMLC_*, and refuses two launchers whose variables disagree.
//
// A launcher's rank and size count the processes it started, which are all of one role: under a worker role they are
// the workers' (num_workers), under a server role the servers' (num_servers). Servers beside srun- or mpirun-started
// workers are a separate step (or `commsched launch`), so each role's count comes from its own launcher.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace commsched {

// One contract field as a launcher sets it.
struct LauncherSetting {
  std::string value;  // text the field's registry row parses
  std::string var;    // the variable it came from (errors and `commsched env` name it)
  std::string how;    // how it was derived, when not read as is ("first host of ...")
};

struct LauncherView {
  std::string launcher;                              // "torchrun/Ray", "Slurm", "Open MPI", "DMLC (BytePS)"
  std::map<std::string, LauncherSetting> fields;     // by registry option name
  std::string missing_root;                          // non-empty: no root address, and what to set (Open MPI)
  std::vector<std::string> notes;                    // what `commsched env` says besides the fields
  // Non-empty: this launcher started the process from a process of its own that another launcher may have started
  // (torchrun's agent, a Ray node): Slurm's and Open MPI's variables then describe that parent, not this process.
  std::string parent;
};

// The views of every launcher whose variables are set, highest precedence first. `server`: this process's role.
std::vector<LauncherView> launcher_views(bool server);

// Slurm's compressed host lists ("node[10-12,20],gpu-a[01-02]"): every host in order, zero padding kept. Throws
// InvalidArgument naming `var` on malformed text (unbalanced brackets, an empty or reversed range, a bad number) or
// when the list names more than `max_hosts` hosts.
std::vector<std::string> expand_slurm_hostlist(const std::string& var, const std::string& text,
                                               size_t max_hosts = 1 << 16);
// The first host of such a list (the whole list is checked; nothing beyond the first host is expanded).
std::string first_slurm_host(const std::string& var, const std::string& text);
// Slurm's tasks per node ("2(x3),1" = 2,2,2,1). Throws InvalidArgument naming `var` on malformed text.
std::vector<int> expand_slurm_tasks_per_node(const std::string& var, const std::string& text);
// The root port of a launcher's job (SLURM_JOB_ID, Open MPI's OMPI_MCA_ess_base_jobid): every process and step of
// one job derives the same one, two jobs sharing a host most likely different ones (10000 + 4 * (job id mod 5000):
// below Linux's ephemeral range, with room for the ports a rendezvous adds to it).
int port_for_job(const std::string& var, const std::string& job_id);

// BytePS's `DMLC_ROLE=scheduler` (with no COMMSCHED_ROLE): the line a scheduler process prints before exiting 0, as
// commsched needs no scheduler; empty otherwise.
std::string scheduler_role_notice();

}  // namespace commsched
