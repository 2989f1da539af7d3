// The cluster contract read from torchrun's variables, and COMMSCHED_* / DMLC_* winning over them.
#include <gtest/gtest.h>

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
                          "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
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

}  // namespace
}  // namespace commsched
