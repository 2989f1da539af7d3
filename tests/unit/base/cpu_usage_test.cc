// The CPU accounting benchmarks report (base/cpu_usage.h): a child's CPU time reaches the parent once it is reaped,
// and the machine's counters move forward with busy never above total.
#include "base/cpu_usage.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <thread>

namespace commsched {
namespace {

// Burns `seconds` of this process's own CPU clock (not wall time: a loaded machine only makes it take longer).
void burn_cpu(double seconds) {
  timespec ts{};
  volatile unsigned long sink = 0;
  do {
    for (int i = 0; i < 100000; ++i) sink = sink + i;
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  } while (double(ts.tv_sec) + double(ts.tv_nsec) / 1e9 < seconds);
}

TEST(CpuUsage, AReapedChildsCpuTimeCountsForItsParent) {
  const double before = process_cpu_s(/*children=*/true);
  CpuMeter meter;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    burn_cpu(0.3);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_GE(process_cpu_s(true) - before, 0.29);
  EXPECT_GT(meter.children_cores(), 0.0);
  EXPECT_LE(meter.children_cores(), 64.0);  // CPU seconds per wall second: at most the cores a machine has
}

TEST(CpuUsage, TheMachinesBusyShareIsAFraction) {
  const auto first = machine_ticks();
  ASSERT_TRUE(first) << "/proc/stat unreadable";
  EXPECT_LE(first->busy, first->total);
  CpuMeter meter;
  burn_cpu(process_cpu_s(false) + 0.1);  // 0.1 s more of this process's CPU: the machine's counters move
  const auto busy = meter.machine_busy();
  ASSERT_TRUE(busy);
  EXPECT_GT(*busy, 0.0);
  EXPECT_LE(*busy, 1.0);
}

// A process bound to fewer cores than the machine has (taskset, a cpuset, Slurm's binding) may use only those: the
// PS partition rule and the server's summing threads count them, not the machine's.
TEST(CpuUsage, UsableCoresFollowTheAffinityNotTheMachine) {
  EXPECT_GE(usable_cores(), 1u);
  EXPECT_LE(usable_cores(), std::max(1u, std::thread::hardware_concurrency()));
  unsigned seen = 0;
  std::thread bound([&] {  // the affinity is per thread; bind a thread of our own to its first allowed core
    cpu_set_t all, one;
    ASSERT_EQ(::sched_getaffinity(0, sizeof(all), &all), 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &all)) {
        CPU_SET(c, &one);
        break;
      }
    ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
    seen = usable_cores();
  });
  bound.join();
  EXPECT_EQ(seen, 1u);
}

}  // namespace
}  // namespace commsched
