// The cluster contract read from torchrun's variables, and COMMSCHED_* / DMLC_* winning over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "comm_backends/cluster_env.h"
#include "scheduler/types.h"

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
                          "COMMSCHED_TIMEOUT", "COMMSCHED_BIND"})
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

TEST(ClusterEnv, CommschedAndDmlcNamesWinOverTorchrunNames) {
  Env env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29500"}, {"COMMSCHED_RANK", "1"},
           {"DMLC_NUM_WORKER", "2"}, {"COMMSCHED_ROOT_PORT", "4000"}});
  const ClusterEnv e = ClusterEnv::from_env();
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.num_workers, 2);
  EXPECT_EQ(e.root_port, 4000);
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
