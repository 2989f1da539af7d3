// The bound of stale-synchronous training (COMMSCHED_PS_MODE=ssp), for one tensor (key) on one server: which pushed
// rounds may be answered now. Pure bookkeeping (no data, no clock), so the bound is unit-tested alone.
//
// Rule: the answer to worker r's push of round t is held until every worker that takes part has pushed round t-k
// (k = COMMSCHED_STALENESS). A worker computes its next round only with that answer, so it never runs more than k
// rounds ahead of the slowest: with k = 0 every answer waits for every worker's push of the same round (as sync).
// Without a bound (async) every push is answered at once.
//
// A worker that stands aside (it has joined, Horovod's join: no more data) never holds the others back; once every
// worker has joined, reset() forgets every round, as the workers restart their rounds from 0. A lost worker (elastic
// membership) is the same operation as standing aside.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace commsched::ps {

class StalenessGate {
 public:
  struct Ticket {
    uint32_t rank = 0;
    uint64_t round = 0;
    uint64_t id = 0;  // the caller's: which push this is (several ranges of one round may be held)
  };
  // bound: k (ssp); nullopt: no bound (async).
  StalenessGate(uint32_t workers, std::optional<uint64_t> bound);

  // Worker `rank` pushed (a range of) `round`: ticket `t`. Appends every ticket that may be answered now (this one or
  // earlier held ones) to `released`. Returns why the push is refused ("" when accepted): a bad rank, a round below
  // its last one, or a worker that stood aside.
  std::string pushed(const Ticket& t, std::vector<Ticket>& released);
  // `rank` no longer holds the others back (joined; or lost). Appends the tickets that may be answered now.
  void stand_aside(uint32_t rank, std::vector<Ticket>& released);
  // Every worker takes part again and starts from round 0 (after every worker has joined). Nothing may be held.
  void reset();

  // The round every worker that takes part has pushed (-1: some worker has pushed nothing yet); no worker takes
  // part: INT64_MAX.
  int64_t slowest() const;
  size_t held() const { return held_.size(); }

 private:
  bool may_answer(uint64_t round) const;
  void release(std::vector<Ticket>& released);

  std::optional<uint64_t> bound_;
  std::vector<std::optional<uint64_t>> last_;  // by rank: the last round pushed
  std::vector<bool> aside_;                    // by rank
  std::vector<Ticket> held_;                   // in arrival order
};

}  // namespace commsched::ps
