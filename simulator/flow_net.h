// A flow-level network: links shared max-min fairly among the connections that have bytes on them, as TCP shares a
// NIC among its flows. The FIFO models (network.h Link, ps_cluster.h Downlink) serve one message at a time in arrival
// order; under incast (W workers pushing into one server) that acknowledges the first push after p/rate and the last
// after W·p/rate, where fair sharing acknowledges all W near W·p/rate. Credit is released on those acknowledgements,
// so the two models disagree on how long a worker's credit stays taken.
//
// A connection is a FIFO of messages from one sender's uplink to one receiver's downlink (one TCP connection per
// process pair, as the PS transports open them): only its oldest unfinished message moves, at the rate progressive
// filling gives it. Rates change only when a message starts or finishes, so the network keeps one pending event on
// the loop, for the earliest finish at the current rates, and recomputes every rate at each change (O(links^2 +
// flows) per change: meant for the every-worker PS model, up to a few dozen processes).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "simulator/fabric.h"

namespace commsched::sim {

class FlowNet {
 public:
  explicit FlowNet(EventLoop& loop) : loop_(loop) {}
  // A link of `bps` bits per second; returns its id.
  int add_link(double bps);
  // A connection from link `up` (its sender's) to link `down` (its receiver's); returns its id.
  int add_connection(int up, int down);
  // Queues `bytes` on connection `conn` now; `arrived` runs a latency after its last byte crossed both links.
  // A message of 0 bytes (an acknowledgement) arrives a latency after everything queued before it on `conn`.
  void send(int conn, uint64_t bytes, Nanos latency, std::function<void()> arrived);
  // Time link `link` spent carrying bytes so far, as bytes carried / its rate (a link at half its rate for 2 s: 1 s).
  Nanos busy(int link) const;

 private:
  struct Message {
    double left;  // bytes still to cross
    Nanos latency;
    std::function<void()> arrived;
  };
  struct Connection {
    int up, down;
    std::deque<Message> queue;  // front: the one moving
    double rate = 0;            // bytes per ns, while the front moves
  };
  struct LinkState {
    double capacity;  // bytes per ns
    double carried = 0;
  };

  void advance();     // moves every front message on at its rate, up to now
  void finish_done();  // delivers the fronts that have no bytes left; the next message of each starts
  void reallocate();  // progressive filling over the connections with a front
  void schedule();    // one event, for the earliest finish at the current rates
  void on_event(uint64_t generation);

  EventLoop& loop_;
  std::vector<LinkState> links_;
  std::vector<Connection> conns_;
  std::vector<int> active_;  // connections with a message moving, in the order they became active
  Nanos updated_ = 0;        // when advance() last ran
  uint64_t generation_ = 0;  // the pending event's; a newer schedule() makes older events no-ops
};

}  // namespace commsched::sim
