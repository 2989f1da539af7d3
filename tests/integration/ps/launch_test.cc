// `commsched launch`: a local cluster around a command; success, teardown when a process fails, Ctrl-C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <dirent.h>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/ps/transport.h"
#include "plugins/launch/process_group.h"

using namespace std::chrono_literals;

namespace {

// Every process of a launch (launcher, servers, workers and anything they start) inherits this variable from the
// launcher's environment, so /proc/<pid>/environ finds all of them, even after an exec replaced the command line.
constexpr const char* kMarkerVar = "COMMSCHED_TEST_LAUNCH_MARKER";

// Processes whose environment carries `marker`.
int count_processes_with(const std::string& marker) {
  const std::string needle = std::string(kMarkerVar) + "=" + marker;
  int n = 0;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/environ");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string env = ss.str();
    for (size_t at = env.find(needle); at != std::string::npos; at = env.find(needle, at + 1))
      if ((at == 0 || env[at - 1] == '\0') && (at + needle.size() == env.size() || env[at + needle.size()] == '\0')) {
        ++n;
        break;
      }
  }
  closedir(d);
  return n;
}

// Polls until `pred` holds or `timeout` passes; returns whether it held.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::string unique_marker() { return "marker" + std::to_string(getpid()) + "x" + std::to_string(std::random_device{}()); }

std::string temp_dir() {
  char tmpl[] = "/tmp/commsched-launch-test-XXXXXX";
  return mkdtemp(tmpl);
}

// Runs the launcher in a process group of its own with the marker in its environment; the group kills it if the
// test fails early.
struct Launch {
  commsched::ProcessGroup group;
  pid_t pid = -1;
  Launch(std::vector<std::string> args, const std::string& marker) {
    pid = group.member(group.spawn(commsched::ProcessSpec{"launcher", std::move(args), {{kMarkerVar, marker}}, ""})).pid;
  }
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    if (!group.wait_all(timeout)) return std::nullopt;
    return group.members().front().code;
  }
};

}  // namespace

TEST(PsLaunch, RunsACommandAsWorkersWithServers) {
  const std::string m = unique_marker();
  Launch l({PS_LAUNCHER, "launch", "-w", "3", "-s", "2", "--", PS_TEST_WORKER, "--tensors", "20", "--iterations",
            "2", "--max-bytes", "100000", "--seed", "5", "--out", "/dev/null", "--ready", "/dev/null", "--mode", "exact"},
           m);
  auto rc = l.wait_exit(60s);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 0);
  EXPECT_EQ(count_processes_with(m), 0);
}

// Every process of a launch gets the run's secret, and it is fresh for each run.
TEST(PsLaunch, EveryRunHasItsOwnSecretSharedByAllItsProcesses) {
  std::string secrets[2];
  for (auto& secret : secrets) {
    const std::string dir = temp_dir();
    Launch l({PS_LAUNCHER, "launch", "-w", "3", "-s", "0", "--", "/bin/sh", "-c",
              "printf %s \"$COMMSCHED_SECRET\" > " + dir + "/secret$COMMSCHED_RANK"},
             unique_marker());
    auto rc = l.wait_exit(30s);
    ASSERT_TRUE(rc.has_value());
    ASSERT_EQ(*rc, 0);
    for (int w = 0; w < 3; ++w) {
      std::ifstream f(dir + "/secret" + std::to_string(w));
      std::string s;
      std::getline(f, s);
      EXPECT_GE(s.size(), 32u) << "worker " << w;
      if (w == 0) secret = s;
      EXPECT_EQ(s, secret) << "worker " << w;
      std::remove((dir + "/secret" + std::to_string(w)).c_str());
    }
    rmdir(dir.c_str());
  }
  EXPECT_NE(secrets[0], secrets[1]);
}

// On one host the cluster runs over UCX shared memory when UCX is built in (ZeroMQ otherwise), with the per-run
// secret (the default: the UCX handshake proves it) and without one (COMMSCHED_AUTH=off), and the sums stay exact.
TEST(PsLaunch, OneHostUsesUcxSharedMemoryWhenBuiltIn) {
  if (std::getenv("COMMSCHED_PS_TRANSPORT") || std::getenv("UCX_TLS") || std::getenv("COMMSCHED_AUTH"))
    GTEST_SKIP() << "COMMSCHED_PS_TRANSPORT, UCX_TLS or COMMSCHED_AUTH is set in this environment: launch keeps the "
                    "caller's choice";
  for (const bool auth_off : {true, false}) {
    if (auth_off) ::setenv("COMMSCHED_AUTH", "off", 1);
    const std::string m = unique_marker();
    const std::string file = "/tmp/" + m + ".transport";
    const std::string cmd = std::string("echo \"$COMMSCHED_PS_TRANSPORT $UCX_TLS\" > ") + file + "$COMMSCHED_RANK; exec " +
                            PS_TEST_WORKER + " --tensors 10 --iterations 2 --max-bytes 100000 --mode exact --tag " + m;
    Launch l({PS_LAUNCHER, "launch", "-w", "2", "-s", "1", "--", "/bin/sh", "-c", cmd}, m);
    auto rc = l.wait_exit(60s);
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 0);
    for (int w = 0; w < 2; ++w) {
      std::ifstream f(file + std::to_string(w));
      std::string line;
      std::getline(f, line);
      EXPECT_EQ(line, commsched::ps::ucx_built_in() ? "ucx sm,self" : " ") << "worker " << w << (auth_off ? " (no secret)" : " (per-run secret)");
      std::remove((file + std::to_string(w)).c_str());
    }
    ::unsetenv("COMMSCHED_AUTH");
  }
}

TEST(PsLaunch, AFailingWorkerTearsDownTheCluster) {
  const std::string m = unique_marker();
  const std::string dir = temp_dir();
  // Worker 1 exits 5 when the test says go (once every process is seen running); the servers and the other workers
  // (sleeping) must be torn down.
  Launch l({PS_LAUNCHER, "launch", "-w", "3", "-s", "2", "--", "/bin/sh", "-c",
            "if [ \"$COMMSCHED_RANK\" = 1 ]; then while [ ! -e " + dir + "/go ]; do sleep 0.01; done; exit 5; fi; "
            "exec sleep 60"},
           m);
  ASSERT_TRUE(eventually([&] { return count_processes_with(m) >= 6; }, 20s))
      << "expected the launcher, 2 servers and 3 workers; saw " << count_processes_with(m);
  std::ofstream(dir + "/go") << "go\n";
  auto rc = l.wait_exit(20s);
  ASSERT_TRUE(rc.has_value()) << "launcher did not exit";
  EXPECT_EQ(*rc, 5);
  EXPECT_TRUE(eventually([&] { return count_processes_with(m) == 0; }, 5s))
      << count_processes_with(m) << " process(es) left behind";
  std::remove((dir + "/go").c_str());
  rmdir(dir.c_str());
}

// Ctrl-C once every process runs: the launcher exits 130 and nothing of the run is left. (It counts the processes
// before the interrupt too, so a marker that found nothing could not pass the test.)
TEST(PsLaunch, InterruptStopsEverything) {
  const std::string m = unique_marker();
  const std::string dir = temp_dir();
  Launch l({PS_LAUNCHER, "launch", "-w", "2", "-s", "1", "--", "/bin/sh", "-c",
            "touch " + dir + "/ready$COMMSCHED_RANK; exec sleep 60"},
           m);
  ASSERT_TRUE(eventually([&] { return std::ifstream(dir + "/ready0").good() && std::ifstream(dir + "/ready1").good(); },
                         20s));
  ASSERT_TRUE(eventually([&] { return count_processes_with(m) == 4; }, 10s))
      << "expected the launcher, 1 server and 2 workers; saw " << count_processes_with(m);
  ::kill(l.pid, SIGINT);
  auto rc = l.wait_exit(20s);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 130);
  // The launcher reaps its children before exiting: nothing may be left at all.
  EXPECT_EQ(count_processes_with(m), 0);
  for (int w = 0; w < 2; ++w) std::remove((dir + "/ready" + std::to_string(w)).c_str());
  rmdir(dir.c_str());
}
