// Which worker holds the others back, and by how much: the question users of synchronous training ask most. Each
// PS server sees every worker's pushes with their iteration, and the all-reduce negotiator's rank 0 every rank's
// ready reports with their round; a worker is behind when the others have pushed for an iteration it has not
// reached, and its lag is how long ago the first of them did. (With synchronous sums the others cannot get far
// ahead; they wait, so the lag is mostly time, not iterations; async and ssp let them run ahead.) Pure: the caller
// passes the clock. Shared by comm_backends/ps and comm_backends/collective; straggler.h ships its verdicts.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace commsched {

class LagTracker {
 public:
  using Clock = std::chrono::steady_clock;
  struct Lag {
    uint32_t worker = 0;
    uint64_t iteration = 0;  // the last iteration it pushed for
    uint64_t lead = 0;       // the furthest iteration any worker pushed for
    double seconds = 0;      // since the first worker pushed for iteration+1
  };

  explicit LagTracker(int workers) : iteration_(static_cast<size_t>(workers)) {}
  void pushed(uint32_t worker, uint64_t iteration, Clock::time_point now);
  // The worker has joined (it has no more data): it is never a laggard until it pushes again.
  void forget(uint32_t worker) {
    if (worker < iteration_.size()) iteration_[worker].reset();
  }
  // Workers (that pushed at least once) lagging at least `min_seconds`, most behind first.
  std::vector<Lag> laggards(Clock::time_point now, double min_seconds) const;

 private:
  std::vector<std::optional<uint64_t>> iteration_;  // by worker rank
  std::map<uint64_t, Clock::time_point> first_;     // when some worker first pushed for each recent iteration
};

}  // namespace commsched
