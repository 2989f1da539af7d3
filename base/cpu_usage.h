// CPU time, where a measurement must say how much of the machine it used: a benchmark on a shared machine whose
// processes (or the kernel moving their packets) keep every core busy measures the CPU, not the network or the
// schedule it claims to (issue 26 item 5: 16 real workers on 2 cores). One reader for the process counters and the
// machine's /proc/stat, for every benchmark.
#pragma once

#include <cstdint>
#include <optional>

namespace commsched {

// The cores the calling thread may run on: its CPU affinity, which a process's threads inherit from where it started
// (what taskset, a cgroup's cpuset or a launcher's per-rank binding leave it) and which
// std::thread::hardware_concurrency() ignores; that where the affinity cannot be read. At least 1.
unsigned usable_cores();

// User + system CPU seconds of this process (self) or of its waited-for descendants (children: every process it
// started and reaped, and theirs, once reaped).
double process_cpu_s(bool children);

// The machine's cumulative CPU ticks, all cores: busy (user, nice, system, irq, softirq, steal) and total (busy plus
// idle and iowait). The kernel's work for a process (softirq moving its packets) counts as busy here though it may be
// charged to no process. nullopt where /proc/stat cannot be read.
struct MachineTicks {
  uint64_t busy = 0, total = 0;
};
std::optional<MachineTicks> machine_ticks();

// Over an interval: the share of the machine's CPU that was busy (0-1, all cores), and the cores the process's
// children used on average (CPU seconds per wall second).
class CpuMeter {
 public:
  CpuMeter();
  // Since construction (or the last restart): nullopt machine share where /proc/stat was unreadable.
  std::optional<double> machine_busy() const;
  double children_cores() const;
  void restart();

 private:
  std::optional<MachineTicks> ticks_;
  double children_s_ = 0;
  double wall_s_ = 0;
};

}  // namespace commsched
