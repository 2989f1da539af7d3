// The cluster contract read from torchrun's variables, and COMMSCHED_* / DMLC_* winning over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "comm_backends/cluster_env.h"
#include "comm_backends/launcher_env.h"
#include "base/types.h"

namespace commsched {
namespace {

// Sets variables for one test and removes them (and every contract variable) afterwards.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    clear();
    for (auto [k, v] : vars) setenv(k, v, 1);
  }
  ~Env() { clear(); }

 private:
  static void clear() {
    for (const char* k : {"COMMSCHED_ROLE", "COMMSCHED_RANK", "COMMSCHED_NUM_WORKERS", "COMMSCHED_NUM_SERVERS",
                          "COMMSCHED_ROOT_ADDR", "COMMSCHED_ROOT_PORT", "COMMSCHED_LOCAL_RANK", "COMMSCHED_LOCAL_SIZE",
                          "DMLC_ROLE", "DMLC_WORKER_ID", "DMLC_NUM_WORKER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                          "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "COMMSCHED_TIMEOUT", "COMMSCHED_BIND", "DMLC_SERVER_ID", "DMLC_NUM_SERVER", "DMLC_INTERFACE",
                          "TORCHELASTIC_RUN_ID", "RAY_RAYLET_PID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID",
                          "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
                          "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "OMPI_MCA_ess_base_jobid", "TORCHELASTIC_RESTART_COUNT", "COMMSCHED_GENERATION",
                          "COMMSCHED_MIN_WORKERS", "COMMSCHED_MAX_WORKERS", "COMMSCHED_ELASTIC_STORE"})
      unsetenv(k);
  }
};

TEST(ClusterEnv, TorchrunVariablesAreTheContract) {
  Env env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
           {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.role, Role::worker);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.num_workers, 4);
  EXPECT_EQ(e.num_servers, 0);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.root_addr, "10.1.2.3");
  EXPECT_EQ(e.root_port, 29501) << "torchrun's agent store holds MASTER_PORT";
}

// Each restart of torchrun's agent is a new generation: its rendezvous keys differ from the last one's.
TEST(ClusterEnv, TorchrunRestartCountIsTheGeneration) {
  {
    Env env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "2"}});
    EXPECT_EQ(ClusterEnv::from_env().generation, 2);
  }
  Env env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "2"}, {"COMMSCHED_GENERATION", "5"}});
  EXPECT_EQ(ClusterEnv::from_env().generation, 5);
}

TEST(ClusterEnv, ElasticBoundsAreCheckedAndNamed) {
  {
    Env env({{"COMMSCHED_MIN_WORKERS", "2"}, {"COMMSCHED_MAX_WORKERS", "4"}, {"COMMSCHED_ELASTIC_STORE", "h:1"}});
    const ClusterEnv e = ClusterEnv::from_env();
    EXPECT_EQ(e.min_workers, 2);
    EXPECT_EQ(e.max_workers, 4);
    EXPECT_EQ(e.elastic_store, "h:1");
  }
  Env env({{"COMMSCHED_MIN_WORKERS", "5"}, {"COMMSCHED_MAX_WORKERS", "4"}});
  try {
    ClusterEnv::from_env();
    FAIL() << "a minimum above the maximum was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_MIN_WORKERS=5 is above COMMSCHED_MAX_WORKERS=4"),
              std::string::npos)
        << e.what();
  }
}

TEST(ClusterEnv, CommschedNamesWinOverEveryLauncher) {
  Env env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29500"}, {"COMMSCHED_RANK", "1"},
           {"DMLC_NUM_WORKER", "2"}, {"COMMSCHED_NUM_WORKERS", "2"}, {"COMMSCHED_ROOT_PORT", "4000"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.num_workers, 2) << "WORLD_SIZE=4 and DMLC_NUM_WORKER=2 disagree, but COMMSCHED_NUM_WORKERS settles it";
  EXPECT_EQ(e.root_port, 4000);
}

// Asserts that from_env() throws InvalidArgument whose message holds every needle.
void expect_env_error(std::initializer_list<const char*> needles) {
  try {
    ClusterEnv::from_env();
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

TEST(ClusterEnv, TorchrunWinsOverDmlcAndDisagreementNamesBoth) {
  {
    Env env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"DMLC_WORKER_ID", "1"},
             {"DMLC_NUM_WORKER", "2"}, {"DMLC_NUM_SERVER", "1"}, {"DMLC_PS_ROOT_URI", "10.0.0.9"}});
    const ClusterEnv e = ClusterEnv::from_env();  // they agree: the higher one's root, DMLC's server count
    EXPECT_EQ(e.root_addr, "10.0.0.1");
    EXPECT_EQ(e.num_servers, 1);
  }
  Env env({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"DMLC_NUM_WORKER", "2"}});
  expect_env_error({"WORLD_SIZE=4 (torchrun/Ray)", "DMLC_NUM_WORKER=2 (DMLC (BytePS))", "COMMSCHED_NUM_WORKERS"});
}

TEST(ClusterEnv, SlurmContract) {
  Env env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
           {"SLURM_NODEID", "1"}, {"SLURM_JOB_NODELIST", "node[07-08]"}, {"SLURM_JOB_ID", "1234"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.role, Role::worker);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.num_workers, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.root_addr, "node07");
  EXPECT_EQ(e.root_port, 10000 + 4 * 1234);
  const std::string why = ClusterEnv::explain_env();
  EXPECT_NE(why.find("launcher: Slurm"), std::string::npos) << why;
  EXPECT_NE(why.find("root_addr = node07  (Slurm: first host of SLURM_JOB_NODELIST)"), std::string::npos)
      << why;
  EXPECT_NE(why.find("worker 3 of 4"), std::string::npos) << why;
}

TEST(ClusterEnv, SlurmTasksPerNodeVariantsAndOverrides) {
  {
    Env env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "3"},
             {"SLURM_TASKS_PER_NODE", "2,4"}, {"SLURM_JOB_ID", "7"}, {"COMMSCHED_ROOT_PORT", "4100"}});
    const ClusterEnv e = ClusterEnv::from_env();
    EXPECT_EQ(e.local_size, 3) << "SLURM_NTASKS_PER_NODE first";
    EXPECT_EQ(e.root_port, 4100) << "a port that is set wins over SLURM_JOB_ID's";
  }
  {
    Env env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_TASKS_PER_NODE", "2,4"}, {"SLURM_NODEID", "2"}});
    expect_env_error({"SLURM_NODEID=2", "SLURM_TASKS_PER_NODE='2,4'"});
  }
  Env env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "node[1-"}});
  expect_env_error({"SLURM_JOB_NODELIST='node[1-'", "not closed"});
}

// Servers as their own srun step: Slurm counts the servers, the workers' count is given.
TEST(ClusterEnv, SlurmStepOfServersCountsServers) {
  Env env({{"COMMSCHED_ROLE", "server"}, {"COMMSCHED_NUM_WORKERS", "4"}, {"SLURM_PROCID", "1"},
           {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}, {"SLURM_JOB_NODELIST", "cn5"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.role, Role::server);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.num_servers, 2);
  EXPECT_EQ(e.num_workers, 4);
  EXPECT_EQ(e.root_addr, "cn5");
}

TEST(ClusterEnv, OpenMpiContractAndItsRoot) {
  {
    Env env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"OMPI_MCA_ess_base_jobid", "42008577"}});
    const ClusterEnv e = ClusterEnv::from_env();
    EXPECT_EQ(e.root_port, 10000 + 4 * (42008577 % 5000));
    EXPECT_EQ(e.rank, 2);
    EXPECT_EQ(e.num_workers, 4);
    EXPECT_EQ(e.local_rank, 2);
    EXPECT_EQ(e.local_size, 4);
    EXPECT_EQ(e.root_addr, "127.0.0.1") << "every rank on this host";
  }
  {
    Env env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    expect_env_error({"set COMMSCHED_ROOT_ADDR", "OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4"});
  }
  Env env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"COMMSCHED_ROOT_ADDR", "head"}});
  EXPECT_EQ(ClusterEnv::from_env().root_addr, "head");
}

TEST(ClusterEnv, SlurmWinsOverOpenMpiAndDisagreementNamesBoth) {
  {
    Env env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[1-2]"},
             {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    EXPECT_EQ(ClusterEnv::from_env().root_addr, "a1");
  }
  {
    Env env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    expect_env_error({"SLURM_PROCID=0 (Slurm)", "OMPI_COMM_WORLD_RANK=1 (Open MPI)", "disagree on rank",
                      "COMMSCHED_RANK"});
  }
  Env env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a1"}, {"OMPI_COMM_WORLD_RANK", "1"},
           {"OMPI_COMM_WORLD_SIZE", "2"}, {"COMMSCHED_RANK", "1"}});
  EXPECT_EQ(ClusterEnv::from_env().rank, 1) << "an explicit COMMSCHED_RANK settles the disagreement";
}

// srun starting one torchrun agent per node: Slurm counts the agents, torchrun the workers.
TEST(ClusterEnv, TorchrunAgentUnderSrunIgnoresSlurmCounts) {
  Env env({{"TORCHELASTIC_RUN_ID", "job"}, {"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
           {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29400"}, {"SLURM_PROCID", "1"},
           {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-2]"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.num_workers, 8);
  EXPECT_EQ(e.local_size, 4);
  EXPECT_NE(ClusterEnv::explain_env().find("Slurm's variables ignored"), std::string::npos);
}

// A Ray cluster started by Slurm: Ray Train's workers inherit the raylet's Slurm variables.
TEST(ClusterEnv, RayWorkerOnSlurmIgnoresSlurmCounts) {
  Env env({{"RAY_RAYLET_PID", "4242"}, {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.5"},
           {"MASTER_PORT", "40000"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "n1"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.num_workers, 4);
  EXPECT_EQ(e.root_addr, "10.0.0.5");
  const std::string why = ClusterEnv::explain_env();
  EXPECT_NE(why.find("Slurm's variables ignored: they describe the Ray node"), std::string::npos) << why;
  Env plain({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  expect_env_error({"WORLD_SIZE=4 (torchrun/Ray)", "SLURM_NTASKS=1 (Slurm)"});  // no parent: two launchers disagree
}

TEST(ClusterEnv, BytepsSchedulerRoleIsNoticedNotRun) {
  {
    Env env({{"DMLC_ROLE", "scheduler"}});
    EXPECT_NE(scheduler_role_notice().find("commsched needs no scheduler process"), std::string::npos);
    expect_env_error({"DMLC_ROLE=scheduler", "no scheduler"});
  }
  Env env({{"DMLC_ROLE", "server"}, {"DMLC_NUM_SERVER", "2"}, {"DMLC_SERVER_ID", "1"}});
  EXPECT_EQ(scheduler_role_notice(), "");
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.role, Role::server);
  EXPECT_EQ(e.rank, 1);
}

TEST(SlurmHostlist, ExpandsCompressedSyntaxKeepingPadding) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("L", "node[10-12,20],gpu-a[01-02]"),
            (V{"node10", "node11", "node12", "node20", "gpu-a01", "gpu-a02"}));
  EXPECT_EQ(expand_slurm_hostlist("L", "n[8-10]"), (V{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_slurm_hostlist("L", "n[08-10]"), (V{"n08", "n09", "n10"}));
  EXPECT_EQ(expand_slurm_hostlist("L", "login1"), (V{"login1"}));
  EXPECT_EQ(expand_slurm_hostlist("L", "a,b.example.org"), (V{"a", "b.example.org"}));
  EXPECT_EQ(expand_slurm_hostlist("L", "r[1-2]-n[0-1]"), (V{"r1-n0", "r1-n1", "r2-n0", "r2-n1"}));
  EXPECT_EQ(expand_slurm_hostlist("L", "[3-4]x"), (V{"3x", "4x"}));
  EXPECT_EQ(first_slurm_host("L", "node[10-12,20],gpu-a[01-02]"), "node10");
  EXPECT_EQ(first_slurm_host("L", "gpu-a[001-002]"), "gpu-a001");
  EXPECT_EQ(first_slurm_host("L", "r[2-3]-n[5,1]"), "r2-n5");
}

TEST(SlurmHostlist, MalformedListsAreNamedErrors) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty"},           {"node[1-2", "not closed"},       {"node1-2]", "has no '['"},
      {"node[]", "not a number"}, {"node[2-1]", "backwards"},    {"node[a-b]", "not a number"},
      {"a,,b", "empty host name"}, {"a,", "empty host name"},    {",a", "empty host name"},
      {"node[1-2,]", "not a number"}, {"a b", "a space"},        {"n[[1]]", "not closed"},
      {"n[1-2-3]", "not a number"}, {"n[1234567890]", "not a number"}};
  for (auto [text, why] : bad) {
    try {
      expand_slurm_hostlist("SLURM_JOB_NODELIST", text);
      ADD_FAILURE() << "'" << text << "' accepted";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("SLURM_JOB_NODELIST='") + text + "' is invalid"), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m << " lacks " << why;
    }
    EXPECT_THROW(first_slurm_host("SLURM_JOB_NODELIST", text), InvalidArgument) << text;
  }
  EXPECT_THROW(expand_slurm_hostlist("L", "n[0-99999]", 1000), InvalidArgument) << "a bound, not a hang";
}

TEST(SlurmTasksPerNode, ExpandsRepeatsAndRejectsMalformed) {
  EXPECT_EQ(expand_slurm_tasks_per_node("T", "2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("T", "4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("T", "1,3(x2)"), (std::vector<int>{1, 3, 3}));
  for (const char* text : {"", "2(x3", "0", "2(x0)", "a", "2,,1", "2(3)", "-1", "2(x3),"})
    try {
      expand_slurm_tasks_per_node("SLURM_TASKS_PER_NODE", text);
      ADD_FAILURE() << "'" << text << "' accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("SLURM_TASKS_PER_NODE='") + text + "'"), std::string::npos)
          << e.what();
    }
}

TEST(JobPort, DerivedFromTheJobIdBelowTheEphemeralRange) {
  EXPECT_EQ(port_for_job("SLURM_JOB_ID", "0"), 10000);
  EXPECT_EQ(port_for_job("SLURM_JOB_ID", "4999"), 29996);
  EXPECT_EQ(port_for_job("SLURM_JOB_ID", "5000"), 10000);
  EXPECT_NE(port_for_job("SLURM_JOB_ID", "41"), port_for_job("SLURM_JOB_ID", "42"));
  EXPECT_THROW(port_for_job("SLURM_JOB_ID", "job"), InvalidArgument);
}

TEST(ClusterEnv, BadTorchrunValueNamesTheVariable) {
  Env env({{"RANK", "5"}, {"WORLD_SIZE", "4"}});
  try {
    ClusterEnv::from_env();
    FAIL() << "rank 5 of 4 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=5 is invalid"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("COMMSCHED_RANK"), std::string::npos) << e.what();
  }
  Env bad_port({{"MASTER_PORT", "port"}});
  EXPECT_THROW(ClusterEnv::from_env(), InvalidArgument);
}

// The COMMSCHED_* names are registry rows: their parsers, ranges and defaults are the ones from_env() applies, and an
// older name's bad value is still named by that name.
TEST(ClusterEnv, ContractVariablesAreRegistryRows) {
  std::vector<std::string> vars;
  for (const OptionInfo& o : cluster_option_table().infos()) vars.push_back(o.env);
  for (const char* v : {"COMMSCHED_ROLE", "COMMSCHED_RANK", "COMMSCHED_NUM_WORKERS", "COMMSCHED_NUM_SERVERS",
                        "COMMSCHED_ROOT_ADDR", "COMMSCHED_ROOT_PORT", "COMMSCHED_BIND", "COMMSCHED_LOCAL_RANK",
                        "COMMSCHED_LOCAL_SIZE", "COMMSCHED_TIMEOUT"})
    EXPECT_NE(std::find(vars.begin(), vars.end(), v), vars.end()) << v << " is not a registry row";
  {
    Env env({{"COMMSCHED_TIMEOUT", "2500ms"}, {"COMMSCHED_ROLE", "Server"}, {"COMMSCHED_NUM_SERVERS", "2"},
             {"COMMSCHED_RANK", "1"}, {"COMMSCHED_BIND", "lo"}, {"COMMSCHED_LOCAL_RANK", "0"},
             {"COMMSCHED_LOCAL_SIZE", "1"}});  // as the launcher sets them for a server
    const ClusterEnv e = ClusterEnv::from_env();
    EXPECT_DOUBLE_EQ(e.timeout_s, 2.5);  // the row's duration parser: units accepted
    EXPECT_EQ(e.role, Role::server);
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(e.bind, "lo");
  }
  {
    Env env({});
    const ClusterEnv e = ClusterEnv::from_env();  // the rows' defaults are the struct's
    EXPECT_EQ(e.root_port, 29500);
    EXPECT_DOUBLE_EQ(e.timeout_s, 8.0);
  }
  {
    Env env({{"DMLC_NUM_WORKER", "0"}});
    try {
      ClusterEnv::from_env();
      FAIL() << "zero workers accepted";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("DMLC_NUM_WORKER='0' is invalid"), std::string::npos) << m;
      EXPECT_NE(m.find("[1, "), std::string::npos) << m;
    }
  }
  Env bad_role({{"COMMSCHED_ROLE", "scheduler"}});
  try {
    ClusterEnv::from_env();
    FAIL() << "role 'scheduler' accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_ROLE='scheduler' is invalid: one of worker, server"),
              std::string::npos)
        << e.what();
  }
}

// A server started by hand names only its role, rank and the cluster's shape; its local defaults must not be a
// worker's (rank 2 of 3 servers beside 1 worker was once "LOCAL_RANK=2 must be in [0, 1)").
TEST(ClusterEnv, ServerStartedByHandNeedsNoLocalVariables) {
  Env env({{"COMMSCHED_ROLE", "server"}, {"COMMSCHED_NUM_WORKERS", "1"}, {"COMMSCHED_NUM_SERVERS", "3"},
           {"COMMSCHED_RANK", "2"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.role, Role::server);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_size, 3);
}

TEST(ClusterEnv, LocalRankBeyondLocalSizeNamesBothVariables) {
  Env env({{"COMMSCHED_NUM_WORKERS", "4"}, {"COMMSCHED_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}});
  try {
    ClusterEnv::from_env();
    FAIL() << "local rank 3 of a local size 2 accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("default: COMMSCHED_RANK)=3 is invalid"), std::string::npos) << m;
    EXPECT_NE(m.find("local size 2 (LOCAL_WORLD_SIZE)"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace commsched
