// Which announced push a parameter server lets in next: receiver-driven admission, the rule the simulator's
// every-worker PS model runs (simulator/ps_cluster.cc, --ps-grants).
//
// Why: each worker's scheduler orders only its own uplink. With the workers out of phase, an early worker's urgent
// push (the layer the next forward needs first, produced last) meets at its server's downlink the bulk pushes of
// workers still in their backward, and the link serves them first come first served. Only the server sees every
// worker's pushes to it, so it is where urgency across workers can be ordered.
//
// The protocol this rule serves: a worker announces a push (key priority and bytes, a small message); the server keeps
// every worker's announced pushes and grants them most urgent first; the worker sends the push's data once granted.
// The rule, among the announced pushes not yet granted:
// 1. the most urgent: lowest priority value (the layer's index in forward order; lower is needed sooner);
// 2. then announcement order;
// 3. while fewer than `window_bytes` granted bytes have not yet arrived (so at most window + one push are in flight
//    towards the server: the downlink's queue stays short, and an urgent push announced later waits behind that much
//    at most);
// 4. bounded so nothing starves: a push is granted, at the latest, once `max_overtakes` grants have been issued since
//    it was announced (the oldest such push first), as ReplyOrder bounds a server's replies.
//
// Pure: no clock and no I/O; the owner calls next() whenever a push is announced or arrives.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "scheduler/reply_order.h"

namespace commsched {

class PushGrants {
 public:
  struct Push {
    uint64_t id;        // the owner's handle for it (which worker, which key)
    int32_t priority;   // its partition's: lower is needed sooner
    uint64_t bytes;     // its data on the wire
  };

  explicit PushGrants(uint64_t window_bytes,
                      uint64_t max_overtakes = ReplyOrder<Push>::kDefaultMaxOvertakes);

  // A worker announced a push (bytes > 0).
  void announce(const Push& push);
  // The push to grant now, if one is waiting and fewer than window_bytes granted bytes are still on their way.
  std::optional<Push> next();
  // A granted push of `bytes` has arrived; its bytes leave the window.
  void arrived(uint64_t bytes);

  uint64_t in_flight() const { return in_flight_; }  // granted bytes not yet arrived
  size_t waiting() const { return announced_.size(); }
  uint64_t window_bytes() const { return window_; }

 private:
  uint64_t window_;
  uint64_t in_flight_ = 0;
  ReplyOrder<Push> announced_;  // the order: every push ranks alike, then priority, then arrival, bounded
};

// Which of a worker's pushes skip the grant (the Homa-like variant: bench/RESULTS.md, "Homa-like variant"): the
// worker-side half of the rule above. Why: waiting for a grant adds a round trip to a push, which the measurements
// above found costs more than the ordering gains when every push pays it. A push goes unscheduled (at once, no
// announce) when
// 1. it is urgent: its priority is below `urgent_below` (the backward's last stretch, needed first by the next
//    forward; these are what the grants were meant to hurry), or
// 2. it fits in what is left of its server's unscheduled budget: at most `budget_bytes` unscheduled bytes from this
//    worker on their way to each server (Homa's "a round trip's bytes without asking", replenished as they arrive).
// Every other push is announced and waits for its server's grant (PushGrants). Urgent pushes count in the budget too,
// so bulk waits while urgent bytes are on their way. Pure: the owner calls arrived() when an unscheduled push is in.
class UnscheduledPushes {
 public:
  UnscheduledPushes(size_t servers, uint64_t budget_bytes, int32_t urgent_below);

  // Whether a push of `bytes` with `priority` to `server` goes now (its bytes then count as on their way).
  bool admit(size_t server, int32_t priority, uint64_t bytes);
  // An unscheduled push of `bytes` to `server` has arrived.
  void arrived(size_t server, uint64_t bytes);

  uint64_t in_flight(size_t server) const { return in_flight_.at(server); }

 private:
  uint64_t budget_;
  int32_t urgent_below_;
  std::vector<uint64_t> in_flight_;  // per server: unscheduled bytes not yet arrived
};

// The rule's sizes from the cluster's shape: a server link of `link_bps`, one-way `latency_s`, and `message_s` the fixed
// cost of one message on a link. A round trip's bytes: what the link moves while a grant goes out and its push comes
// in (two latencies, two messages' fixed costs).
// The window: kGrantWindowRoundTrips round trips' bytes, so that the server's link need not idle between grants (the
// design's starting point; bench/RESULTS.md, "receiver-driven grants at the PS servers", measured it and larger
// windows: none made the every-worker simulation faster, so grants are off by default).
inline constexpr double kGrantWindowRoundTrips = 4;
uint64_t grant_window_bytes(double link_bps, double latency_s, double message_s);
// The smallest push that waits for a grant: one round trip's bytes (a smaller push takes the link for less time than
// the announce and the grant would delay it).
uint64_t grant_min_bytes(double link_bps, double latency_s, double message_s);

}  // namespace commsched
