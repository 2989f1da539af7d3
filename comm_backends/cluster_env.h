// The one environment contract every multi-process backend reads (parameter server, Gloo, NCCL rendezvous). Its
// COMMSCHED_* variables are rows of the option registry (cluster_option_table(): parser, default, doc), which
// from_env() applies after the older names below.
//
//   COMMSCHED_ROLE          worker | server                       (alias DMLC_ROLE; default worker)
//   COMMSCHED_NUM_WORKERS   number of worker processes >= 1      (alias DMLC_NUM_WORKER; default 1)
//   COMMSCHED_NUM_SERVERS   number of server processes >= 0      (alias DMLC_NUM_SERVER; default 0)
//   COMMSCHED_RANK          this process's rank within its role   (alias DMLC_WORKER_ID for workers,
//                                                                 DMLC_SERVER_ID for servers; default 0)
//   COMMSCHED_ROOT_ADDR     address of the rendezvous root        (alias DMLC_PS_ROOT_URI; default 127.0.0.1)
//   COMMSCHED_ROOT_PORT     port of the rendezvous root           (alias DMLC_PS_ROOT_PORT; default 29500)
//   COMMSCHED_BIND          address or interface name to bind data sockets to (alias DMLC_INTERFACE; default:
//                           the address this host uses to reach the root)
//   COMMSCHED_LOCAL_RANK / COMMSCHED_LOCAL_SIZE   position among the workers of this host (defaults: rank / workers)
//   COMMSCHED_TIMEOUT       seconds without word from a peer before it is declared dead (default 8: with heartbeat
//                           and polling granularity a hung peer is then caught within 10 s, as the issue requires)
//   COMMSCHED_GENERATION    which membership of an elastic job this is (default 0; torchrun: TORCHELASTIC_RESTART_COUNT):
//                           part of every rendezvous key, so a re-formed group never reads an earlier one's keys
//   COMMSCHED_MIN_WORKERS / COMMSCHED_MAX_WORKERS / COMMSCHED_ELASTIC_STORE   elastic training (python/commsched/
//                           _elastic.py): the bounds on the workers, and the membership store that outlives any worker
//
// Launchers' variables fill what no COMMSCHED_* variable sets, in ONE precedence order (comm_backends/launcher_env.h
// reads each launcher):
//   explicit COMMSCHED_*  >  torchrun / Ray Train (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//   MASTER_PORT)  >  Slurm srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
//   SLURM_TASKS_PER_NODE; root: first host of SLURM_JOB_NODELIST; port from SLURM_JOB_ID)  >  Open MPI mpirun
//   (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; root: loopback when every rank is on this host, else
//   COMMSCHED_ROOT_ADDR must be set; port from OMPI_MCA_ess_base_jobid)  >
//   DMLC_* (BytePS).
// A launcher's rank and size count the processes of this process's role. Under torchrun the rendezvous listens on
// MASTER_PORT + 1 (torchrun's agent store, or rank 0 of torch.distributed's env:// init, holds MASTER_PORT). When two
// launchers count this process differently (rank, sizes, local rank or size), from_env() throws InvalidArgument
// naming both variables; an explicit COMMSCHED_* variable settles it. A worker started by torchrun's agent
// (TORCHELASTIC_RUN_ID) or a Ray worker (RAY_RAYLET_PID) ignores Slurm's and Open MPI's variables: they describe the
// agent or the Ray node.
//
// A bad value raises InvalidArgument naming the variable, the value and what is allowed.
#pragma once

#include <algorithm>

#include <cstdint>
#include <string>

#include "options/option_table.h"

namespace commsched {

enum class Role { worker, server };

struct ClusterEnv {
  Role role = Role::worker;
  int num_workers = 1;
  int num_servers = 0;
  int rank = 0;
  std::string root_addr = "127.0.0.1";
  int root_port = 29500;
  std::string bind;  // empty: choose automatically
  int local_rank = 0;
  int local_size = 1;
  double timeout_s = 8.0;
  int generation = 0;
  int min_workers = 0;        // elastic: fewer workers than this end the job (0: not elastic)
  int max_workers = 0;        // elastic: joiners beyond this wait (0: no bound)
  std::string elastic_store;  // elastic: HOST:PORT of the membership store (`commsched launch --min-workers` serves it)
  // A process set's sub-cluster (python/commsched/torch/process_sets.py) meets in the job's one store, which the
  // global group already serves at root_addr:root_port: no member serves one, and every key is under this prefix
  // ("pset/<id>/"). Empty: the group's rank 0 (server 0 in a PS job) serves its own store. Not an environment variable.
  std::string store_scope;

  static ClusterEnv from_env();
  // What from_env() detects and derives, field by field with its source, for `commsched env`; throws as it does.
  static std::string explain_env();
  // Throws InvalidArgument when a field is out of range (rank >= number of processes of its role, ...).
  void validate() const;
  std::string describe() const;
};

// How long the processes of a job wait for each other while they start (the slowest may still be importing its
// framework on a busy host): at least a minute, and at least three of its silence timeouts.
inline double join_timeout_s(double timeout_s) { return std::max(60.0, 3 * timeout_s); }

// The registry rows of ClusterEnv (group "cluster").
const OptionTable<ClusterEnv>& cluster_option_table();

}  // namespace commsched
