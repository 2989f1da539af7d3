// `commsched launch`: a local cluster around a command; success, teardown when a process fails, Ctrl-C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/ps/transport.h"

using namespace std::chrono_literals;

namespace {

// Processes whose command line contains `marker` (our children carry a unique one).
int count_processes_with(const std::string& marker) {
  int n = 0;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline");
    std::stringstream ss;
    ss << f.rdbuf();
    if (ss.str().find(marker) != std::string::npos) ++n;
  }
  closedir(d);
  return n;
}

std::string unique_marker() { return "marker" + std::to_string(getpid()) + "x" + std::to_string(std::random_device{}()); }

// Spawns the launcher in its own process group; the guard kills that group if the test fails early.
struct Launch {
  pid_t pid = -1;
  explicit Launch(std::vector<std::string> args) {
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    setpgid(pid, pid);
  }
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(20ms);
    }
    return std::nullopt;
  }
  ~Launch() {
    if (pid > 0) {
      ::kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

}  // namespace

TEST(PsLaunch, RunsACommandAsWorkersWithServers) {
  const std::string m = unique_marker();
  Launch l({PS_LAUNCHER, "launch", "-w", "3", "-s", "2", "--", PS_TEST_WORKER, "--tensors", "20", "--iterations",
            "2", "--max-bytes", "100000", "--seed", "5", "--out", "/dev/null", "--ready", "/dev/null", "--mode", "exact",
            "--tag", m});
  auto rc = l.wait_exit(60s);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 0);
  EXPECT_EQ(count_processes_with(m), 0);
}

// On one host the cluster runs over UCX shared memory when UCX is built in (ZeroMQ otherwise), and the sums stay exact.
TEST(PsLaunch, OneHostUsesUcxSharedMemoryWhenBuiltIn) {
  if (std::getenv("COMMSCHED_PS_TRANSPORT") || std::getenv("UCX_TLS"))
    GTEST_SKIP() << "COMMSCHED_PS_TRANSPORT or UCX_TLS is set in this environment: launch keeps the caller's choice";
  const std::string m = unique_marker();
  const std::string file = "/tmp/" + m + ".transport";
  const std::string cmd = std::string("echo \"$COMMSCHED_PS_TRANSPORT $UCX_TLS\" > ") + file + "$COMMSCHED_RANK; exec " +
                          PS_TEST_WORKER + " --tensors 10 --iterations 2 --max-bytes 100000 --mode exact --tag " + m;
  Launch l({PS_LAUNCHER, "launch", "-w", "2", "-s", "1", "--", "/bin/sh", "-c", cmd});
  auto rc = l.wait_exit(60s);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 0);
  for (int w = 0; w < 2; ++w) {
    std::ifstream f(file + std::to_string(w));
    std::string line;
    std::getline(f, line);
    EXPECT_EQ(line, commsched::ps::ucx_built_in() ? "ucx sm,self" : " ") << "worker " << w;
    std::remove((file + std::to_string(w)).c_str());
  }
}

TEST(PsLaunch, AFailingWorkerTearsDownTheCluster) {
  const std::string m = unique_marker();
  // Worker 1 exits 5 after half a second; the servers and the other workers (sleeping) must be torn down.
  Launch l({PS_LAUNCHER, "launch", "-w", "3", "-s", "2", "--", "/bin/sh", "-c",
            "if [ \"$COMMSCHED_RANK\" = 1 ]; then sleep 0.5; exit 5; fi; exec sleep 60", m});
  auto rc = l.wait_exit(20s);
  ASSERT_TRUE(rc.has_value()) << "launcher did not exit";
  EXPECT_EQ(*rc, 5);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(count_processes_with(m), 0);
}

TEST(PsLaunch, InterruptStopsEverything) {
  const std::string m = unique_marker();
  Launch l({PS_LAUNCHER, "launch", "-w", "2", "-s", "1", "--", "/bin/sh", "-c", "exec sleep 60", m});
  std::this_thread::sleep_for(500ms);
  ::kill(l.pid, SIGINT);
  auto rc = l.wait_exit(20s);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 130);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(count_processes_with(m), 0);
}
