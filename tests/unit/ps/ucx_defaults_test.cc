// The UCX transport applies its shared-memory defaults only when UCX_TLS names shared-memory transports alone.
#include <gtest/gtest.h>

#include "comm_backends/ps/ucx_defaults.h"

#include <cstdlib>
#include <string>
#include <vector>

using commsched::ps::ucx_shared_memory_only;

TEST(PsUcxDefaults, SharedMemoryOnlyTransportListsAreRecognised) {
  for (const char* tls : {"sm,self", "sm", "posix,cma", "sysv,cma,self", "shm"})
    EXPECT_TRUE(ucx_shared_memory_only(tls)) << tls;
}

TEST(PsUcxDefaults, NetworkTransportsUnsetAndExclusionListsAreNot) {
  for (const char* tls : {"tcp", "sm,tcp", "rc,ud:aux", "sm,self,rc_x", "^tcp", "", "sm,", "all"})
    EXPECT_FALSE(ucx_shared_memory_only(tls)) << tls;
  EXPECT_FALSE(ucx_shared_memory_only(nullptr));
}

namespace {
using commsched::ps::ucx_default_settings;
using commsched::ps::UcxSetting;

std::string joined(const std::vector<UcxSetting>& v) {
  std::string out;
  for (const UcxSetting& s : v) out += s.name + "=" + s.value + ";";
  return out;
}

// Unsets the UCX variables these tests look at, and restores nothing: no other test here reads them.
void clear_ucx_env() {
  unsetenv("UCX_RNDV_THRESH");
  unsetenv("UCX_RNDV_SCHEME");
}
}  // namespace

TEST(PsUcxDefaults, OverSharedMemoryTheWorkerWritesItsRendezvousSends) {
  clear_ucx_env();
  EXPECT_EQ(joined(ucx_default_settings("sm,self", true)), "RNDV_THRESH=64K;RNDV_SCHEME=put_zcopy;");
  EXPECT_EQ(joined(ucx_default_settings("sm,self", false)), "RNDV_THRESH=64K;");  // the server keeps UCX's get
}

TEST(PsUcxDefaults, NetworkTransportsKeepUcxsOwnChoices) {
  clear_ucx_env();
  EXPECT_EQ(joined(ucx_default_settings("tcp", true)), "");
  EXPECT_EQ(joined(ucx_default_settings("sm,tcp", true)), "");
  EXPECT_EQ(joined(ucx_default_settings(nullptr, true)), "");
}

TEST(PsUcxDefaults, TheUsersVariablesWin) {
  clear_ucx_env();
  setenv("UCX_RNDV_SCHEME", "get_zcopy", 1);
  EXPECT_EQ(joined(ucx_default_settings("sm,self", true)), "RNDV_THRESH=64K;");
  setenv("UCX_RNDV_THRESH", "8K", 1);
  EXPECT_EQ(joined(ucx_default_settings("sm,self", true)), "");
  clear_ucx_env();
}
