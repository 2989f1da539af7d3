// The UCX transport applies its shared-memory defaults only when UCX_TLS names shared-memory transports alone.
#include <gtest/gtest.h>

#include "comm_backends/ps/ucx_defaults.h"

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
