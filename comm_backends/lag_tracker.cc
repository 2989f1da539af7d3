#include "comm_backends/lag_tracker.h"

#include <algorithm>

namespace commsched {

void LagTracker::pushed(uint32_t worker, uint64_t iteration, Clock::time_point now) {
  if (worker >= iteration_.size()) return;
  auto& mine = iteration_[worker];
  if (!mine || iteration > *mine) mine = iteration;
  first_.emplace(iteration, now);  // keeps the earliest
  // Forget iterations every worker has passed: the map stays as small as the spread between workers.
  std::optional<uint64_t> slowest;
  for (const auto& it : iteration_)
    if (it) slowest = slowest ? std::min(*slowest, *it) : *it;
  if (slowest) first_.erase(first_.begin(), first_.lower_bound(*slowest));
}

std::vector<LagTracker::Lag> LagTracker::laggards(Clock::time_point now, double min_seconds) const {
  std::vector<Lag> out;
  if (first_.empty()) return out;
  const uint64_t lead = first_.rbegin()->first;
  for (uint32_t w = 0; w < iteration_.size(); ++w) {
    if (!iteration_[w] || *iteration_[w] >= lead) continue;
    const auto next = first_.upper_bound(*iteration_[w]);  // the first iteration it has not reached
    if (next == first_.end()) continue;
    const double s = std::chrono::duration<double>(now - next->second).count();
    if (s >= min_seconds) out.push_back(Lag{w, *iteration_[w], lead, s});
  }
  std::sort(out.begin(), out.end(), [](const Lag& a, const Lag& b) { return a.seconds > b.seconds; });
  return out;
}

}  // namespace commsched
