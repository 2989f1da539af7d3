// The simulating executables (commsched-sim, `commsched bench`) restart once with glibc's huge-page tunable, through
// the one helper in simulator/huge_pages.h; the restarted process hands its children the environment as it was.
#include "simulator/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace commsched {
namespace {

TEST(HugePages, AddsTheTunableAndKeepsTheUsersOwn) {
  EXPECT_EQ(tunables_with_huge_pages(nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(tunables_with_huge_pages(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(tunables_with_huge_pages("glibc.malloc.arena_max=2"), "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  EXPECT_EQ(tunables_with_huge_pages("glibc.malloc.hugetlb=0"), std::nullopt);  // the user's choice stands
}

TEST(HugePages, TheRestartedProcessPutsTheUsersTunablesBack) {
  char* argv[] = {const_cast<char*>("huge_pages_test"), nullptr};
  const char* had = std::getenv("GLIBC_TUNABLES");
  const std::optional<std::string> ours = had ? std::optional<std::string>(had) : std::nullopt;
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", 1);
  ::setenv("COMMSCHED_TUNABLES_BEFORE_RESTART", "glibc.malloc.arena_max=2", 1);
  restart_with_huge_pages(argv);  // returns: this is "the restarted process"
  EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.arena_max=2");
  EXPECT_EQ(std::getenv("COMMSCHED_TUNABLES_BEFORE_RESTART"), nullptr);
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1", 1);
  ::setenv("COMMSCHED_TUNABLES_BEFORE_RESTART", "", 1);  // it was unset
  restart_with_huge_pages(argv);
  EXPECT_EQ(std::getenv("GLIBC_TUNABLES"), nullptr);
  if (ours) ::setenv("GLIBC_TUNABLES", ours->c_str(), 1);  // this test process's own, as it was
}

// How many programs `command` started: glibc's loader (LD_DEBUG=files) says "transferring control" once per exec.
int programs_started(const std::string& env, const std::string& command) {
  const std::string line = "env -u GLIBC_TUNABLES -u COMMSCHED_TUNABLES_BEFORE_RESTART " + env + " LD_DEBUG=files " +
                           command + " 2>&1 >/dev/null";
  FILE* out = ::popen(line.c_str(), "r");
  if (!out) return -1;
  int started = 0;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, out))
    if (std::string(buf).find("transferring control") != std::string::npos) ++started;
  ::pclose(out);
  return started;
}

TEST(HugePages, BothSimulatingExecutablesRestartOnce) {
  // Counted against a command that does not restart: a sanitizer runtime may re-exec every program once itself.
  const int plain = programs_started("", COMMSCHED_CLI_BIN " options");  // only the command that simulates restarts
  ASSERT_GE(plain, 1);
  EXPECT_EQ(programs_started("", COMMSCHED_SIM_BIN " --help"), plain + 1);
  EXPECT_EQ(programs_started("", COMMSCHED_CLI_BIN " bench --help"), plain + 1);
  EXPECT_EQ(programs_started("GLIBC_TUNABLES=glibc.malloc.hugetlb=0", COMMSCHED_CLI_BIN " bench --help"), plain);
}

}  // namespace
}  // namespace commsched
