// ps_goodput's baselines (bench/ps): UCX perftest's result line read right, perftest run for real where it is
// installed, and the raw TCP echo moving every byte.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/ps/perftest_ceiling.h"
#include "bench/ps/raw_tcp.h"
#include "comm_backends/control/socket.h"

namespace commsched::bench {
namespace {

// ucx_perftest 1.13's output for tag_bw at 4 MiB (the table's header, then the result).
constexpr const char* kOutput =
    "+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+\n"
    "|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |\n"
    "+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+\n"
    "Final:                   100      0.277  1519.051  1519.051     2633.22    2641.50         658         658\n";

TEST(PsPerftestCeiling, ReadsTheOverallBandwidthInMebibytes) {
  const std::optional<double> rate = parse_perftest_final(kOutput);
  ASSERT_TRUE(rate.has_value());
  EXPECT_DOUBLE_EQ(*rate, 2641.50 * 1024 * 1024);
}

TEST(PsPerftestCeiling, NoResultLineIsNoRate) {
  EXPECT_FALSE(parse_perftest_final("[1] perftest.c:405 UCX ERROR client failed. connect() failed\n").has_value());
  EXPECT_FALSE(parse_perftest_final("Final: 100 0.2 1519.0\n").has_value());  // cut short
}

TEST(PsPerftestCeiling, MeasuresSharedMemoryWhereInstalled) {
  if (!have_ucx_perftest()) GTEST_SKIP() << "ucx_perftest is not installed";
  const int port = 30000 + static_cast<int>(getpid() % 20000);
  const std::optional<double> rate = ucx_perftest_rate("sm,self", 1 << 20, 64 << 20, port);
  ASSERT_TRUE(rate.has_value());
  EXPECT_GT(*rate, 50e6);  // shared memory moves far more than this even on a loaded machine
}

TEST(PsPerftestCeiling, AnUnknownTransportGivesNoRate) {
  if (!have_ucx_perftest()) GTEST_SKIP() << "ucx_perftest is not installed";
  const int port = 30001 + static_cast<int>(getpid() % 20000);
  EXPECT_FALSE(ucx_perftest_rate("no_such_transport", 1 << 20, 1 << 20, port).has_value());
}

// The pids of the ucx_perftest processes whose command line names `port` (this test's own: the port is its pid's).
std::vector<pid_t> perftests_on(int port) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find("ucx_perftest") == 0 && cmdline.find(" -p " + std::to_string(port)) != std::string::npos)
      found.push_back(static_cast<pid_t>(std::stol(entry.path().filename().string())));
  }
  return found;
}

// Ctrl-C on ps_goodput in the middle of a measurement (a long one: 256 GiB, a minute of shared memory here) takes
// the perftest server and client with it: they run in process groups of their own, which the terminal's Ctrl-C does
// not reach. Left running, they would also hold the death test's pipe open until they finish.
TEST(PsPerftestCeiling, AnInterruptedMeasurementLeavesNoPerftestBehind) {
  if (!have_ucx_perftest()) GTEST_SKIP() << "ucx_perftest is not installed";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the measurement runs threads of its own
  const int port = 30002 + static_cast<int>(getpid() % 20000);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EXIT(
      {
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          ::kill(::getpid(), SIGINT);
        }).detach();
        ucx_perftest_rate("sm,self", 1 << 20, uint64_t{256} << 30, port);
      },
      testing::KilledBySignal(SIGINT), "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
      << "the interrupted measurement's perftest processes kept running (they held the death test's pipe)";
  std::vector<pid_t> left;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       !(left = perftests_on(port)).empty() && std::chrono::steady_clock::now() < end;)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (pid_t pid : left) ::kill(pid, SIGKILL);  // this test's own perftests, so that a failure leaves nothing either
  EXPECT_TRUE(left.empty()) << left.size() << " ucx_perftest process(es) on port " << port << " outlived the Ctrl-C";
}

TEST(PsRawTcp, EchoMovesEveryByte) {
  const int lfd = listen_on("127.0.0.1", 0);
  const int port = control::bound_port(lfd);
  std::thread server([lfd] { raw_server(lfd); });
  EXPECT_GT(raw_echo("127.0.0.1", port, 64 << 10, 8 << 20, 1 << 20), 0);  // 0 unless every byte came back
  EXPECT_GT(raw_oneway("127.0.0.1", port, 64 << 10, 8 << 20), 0);         // 0 unless the server took them all
  ::shutdown(lfd, SHUT_RDWR);  // ends the server's accept
  server.join();
  ::close(lfd);
}

}  // namespace
}  // namespace commsched::bench
