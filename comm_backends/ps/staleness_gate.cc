#include "comm_backends/ps/staleness_gate.h"

#include <algorithm>
#include <limits>

namespace commsched::ps {

StalenessGate::StalenessGate(uint32_t workers, std::optional<uint64_t> bound)
    : bound_(bound), last_(workers), aside_(workers, false) {}

int64_t StalenessGate::slowest() const {
  int64_t low = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < last_.size(); ++r)
    if (!aside_[r]) low = std::min(low, last_[r] ? static_cast<int64_t>(*last_[r]) : int64_t{-1});
  return low;
}

bool StalenessGate::may_answer(uint64_t round) const {
  if (!bound_) return true;
  // round - k <= slowest, written without underflow: round <= slowest + k.
  const int64_t low = slowest();
  if (low == std::numeric_limits<int64_t>::max()) return true;
  return static_cast<int64_t>(round) - static_cast<int64_t>(*bound_) <= low;
}

void StalenessGate::release(std::vector<Ticket>& released) {
  auto keep = std::stable_partition(held_.begin(), held_.end(), [&](const Ticket& t) { return !may_answer(t.round); });
  released.insert(released.end(), keep, held_.end());
  held_.erase(keep, held_.end());
}

std::string StalenessGate::pushed(const Ticket& t, std::vector<Ticket>& released) {
  const uint32_t rank = t.rank;
  const uint64_t round = t.round;
  if (rank >= last_.size()) return "worker " + std::to_string(rank) + " is out of range";
  if (aside_[rank]) return "worker " + std::to_string(rank) + " pushed after joining (join() must be its last call "
                           "until every worker has joined)";
  if (last_[rank] && round < *last_[rank])
    return "worker " + std::to_string(rank) + " pushed round " + std::to_string(round) + " after round " +
           std::to_string(*last_[rank]);
  last_[rank] = round;
  held_.push_back(t);
  release(released);
  return {};
}

void StalenessGate::stand_aside(uint32_t rank, std::vector<Ticket>& released) {
  if (rank >= aside_.size() || aside_[rank]) return;
  aside_[rank] = true;
  release(released);
}

void StalenessGate::reset() {
  last_.assign(last_.size(), std::nullopt);
  aside_.assign(aside_.size(), false);
}

}  // namespace commsched::ps
