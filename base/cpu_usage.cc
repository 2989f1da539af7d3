#include "base/cpu_usage.h"

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace commsched {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

unsigned usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return unsigned(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

double process_cpu_s(bool children) {
  rusage u{};
  ::getrusage(children ? RUSAGE_CHILDREN : RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

std::optional<MachineTicks> machine_ticks() {
  std::ifstream in("/proc/stat");
  std::string line;
  if (!in || !std::getline(in, line) || line.rfind("cpu ", 0) != 0) return std::nullopt;
  std::istringstream fields(line.substr(4));
  // user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
  uint64_t v[8] = {};
  for (uint64_t& x : v)
    if (!(fields >> x)) return std::nullopt;
  MachineTicks t;
  t.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  t.total = t.busy + v[3] + v[4];
  return t;
}

CpuMeter::CpuMeter() { restart(); }

void CpuMeter::restart() {
  ticks_ = machine_ticks();
  children_s_ = process_cpu_s(true);
  wall_s_ = now_s();
}

std::optional<double> CpuMeter::machine_busy() const {
  const auto now = machine_ticks();
  if (!now || !ticks_ || now->total <= ticks_->total) return std::nullopt;
  return double(now->busy - ticks_->busy) / double(now->total - ticks_->total);
}

double CpuMeter::children_cores() const {
  const double wall = now_s() - wall_s_;
  return wall > 0 ? (process_cpu_s(true) - children_s_) / wall : 0;
}

}  // namespace commsched
