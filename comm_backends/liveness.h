// Which peers of a control loop are alive: the one liveness rule of every loop that talks to peers (the control
// plane's Van, under the PS server and worker, and the collective negotiator), so they cannot drift apart.
//
// A peer is lost when it has said nothing for `silence_limit` (COMMSCHED_TIMEOUT: hung, or unreachable), or when its
// connection ended and it was not forgotten (its goodbye: the loops forget a member that says it) within `bye_grace`. The grace exists because a peer's last message and
// the end of its connection can reach the loop in either order: ZeroMQ reports the disconnection on a monitor socket,
// UCX from an endpoint error callback, neither ordered with the data. Without it, a survivor that hears a neighbour
// close before that neighbour's "peer X lost" report names the neighbour instead of X.
//
// Pure bookkeeping: no I/O and no clock of its own (callers pass `now`), so it is tested without sockets.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace commsched {

// The one heartbeat rule of every control loop (the Van under the PS, the collective negotiation): a loop that has
// sent a peer nothing for an interval sends it a heartbeat, and a peer silent for COMMSCHED_TIMEOUT is lost
// (Liveness::check). The interval is at most a quarter of the timeout, so a peer is declared lost only after
// kBeatsPerTimeout heartbeats in a row went missing: one late packet never looks like a death.
inline constexpr int kBeatsPerTimeout = 4;
// The heartbeat interval of a loop: `configured_s` when a loop has its own option (COMMSCHED_PS_HEARTBEAT, checked by
// check_heartbeat), else a quarter of the timeout within [20 ms, 1 s] (no busier than that, and a hang of one second is
// noticed within a few seconds of COMMSCHED_TIMEOUT).
std::chrono::milliseconds heartbeat_interval(double timeout_s, double configured_s = 0);
// A configured interval must be positive and at most timeout/kBeatsPerTimeout; throws InvalidArgument naming
// `option`, its value and the timeout otherwise.
void check_heartbeat(const std::string& option, double interval_s, double timeout_s);

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;
  struct Loss {
    Id peer;
    std::string why;  // "connection closed" or "no message for N s (hung or unreachable; COMMSCHED_TIMEOUT)"
    // A silent peer's loss: the other peers silent for over half the limit, longest first. One hung process can
    // silence others with it (a sender stopped mid-write holds up a shared-memory FIFO that every peer of this
    // node writes into), so the one judged first is not always the culprit: the report names them all.
    std::vector<Id> also_silent;
    // `why`, and the peers silent with it named by `name`.
    std::string explain(const std::function<std::string(Id)>& name) const;
  };

  explicit Liveness(Clock::duration silence_limit, Clock::duration bye_grace = std::chrono::milliseconds(300));
  // The silence limit in seconds, as COMMSCHED_TIMEOUT gives it.
  explicit Liveness(double silence_limit_s, Clock::duration bye_grace = std::chrono::milliseconds(300));

  // Starts watching `peer`. Silence counts from `heard`; the default (epoch) counts only once it has spoken.
  void watch(Id peer, Clock::time_point heard = {});
  void forget(Id peer);
  bool watching(Id peer) const { return peers_.count(peer) != 0; }

  void heard(Id peer, Clock::time_point now);
  // Its connection ended: lost at `now + bye_grace` unless it is forgotten first (its goodbye arrived).
  void closed(Id peer, Clock::time_point now);

  // The first peer found lost at `now`, if any: closed peers past their grace first, then the longest silent.
  std::optional<Loss> check(Clock::time_point now) const;
  // Peers still expected to speak (watched, connection not ended): the ones to send heartbeats to.
  std::vector<Id> expected() const;
  // How long a loop may block in receive: `wait`, or less while a closed peer's grace is running out.
  std::chrono::milliseconds poll_wait(std::chrono::milliseconds wait, Clock::time_point now) const;

 private:
  struct Peer {
    Clock::time_point heard;
    std::optional<Clock::time_point> closed;
  };
  Clock::duration silence_limit_;
  Clock::duration bye_grace_;
  std::map<Id, Peer> peers_;  // ordered: `check` reports the same peer every time for the same state
};

}  // namespace commsched
