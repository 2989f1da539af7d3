// The goodbye barrier of a control loop: who must say goodbye, who has, whether this node has, and when the barrier
// is passed. One rule for the control plane's Van (PS servers leave once every worker has said bye) and the collective
// negotiator (rank 0 answers every rank's bye with its own, all_bye, once all have; the others wait for it).
//
// A connection that ends after a goodbye on either side is no loss: the member said bye (it is gone as announced),
// or this node did (it waits for nothing more from it). Any other end is a loss, judged by the caller (Liveness,
// LossRelay). A node waits for the goodbyes at most until its deadline, so a member that never says bye cannot hang
// a shutdown.
//
// Pure bookkeeping: no I/O and no clock of its own (callers pass `now`), tested without sockets.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace commsched::control {

class GoodbyeBarrier {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;  // a transport's PeerId, or a rank where each rank has its own socket

  // This node waits for `member`'s goodbye (several calls add up; a repeat changes nothing).
  void await(Id member);
  // `member` said goodbye; true the first time (a repeat, or an unknown member, is no news).
  bool said_bye(Id member);
  bool left(Id member) const;
  // `member`'s connection ended. True when that is expected (it said goodbye, or this node has: it then counts as
  // gone); false means a loss.
  bool ended(Id member);
  // Every awaited member is gone (goodbye, or an expected end).
  bool all_left() const;
  // The awaited members still to say goodbye, in id order.
  std::vector<Id> missing() const;

  // This node has said its goodbye: from now on every member's end is expected.
  void leave() { leaving_ = true; }
  bool leaving() const { return leaving_; }
  // This node waits for the others' goodbyes until `deadline` at most (the earliest of several calls counts).
  void wait_until(Clock::time_point deadline);
  // Every awaited member is gone, or the deadline (if any) has come.
  bool passed(Clock::time_point now) const;

 private:
  std::map<Id, bool> gone_;  // awaited member -> gone
  bool leaving_ = false;
  std::optional<Clock::time_point> deadline_;
};

}  // namespace commsched::control
