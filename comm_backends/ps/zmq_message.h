// The ZeroMQ transport's messages (zmq_transport.cc): a received frame handed on as a Payload without a copy, an
// OutPayload wrapped as a zmq message without a copy (its release runs when ZeroMQ lets go of it), and the events
// of a socket monitor.
#pragma once

#include <zmq.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "comm_backends/ps/transport.h"

namespace commsched::ps {

// `what` and ZeroMQ's description of the last error.
std::string zmq_err(const std::string& what);

// A received frame, owned until the payload is destroyed.
class ZmqPayload final : public Payload {
 public:
  explicit ZmqPayload(zmq_msg_t* m);  // takes the frame over (m is left empty)
  ~ZmqPayload() override;
  std::span<const std::byte> bytes() const override;

 private:
  zmq_msg_t msg_;
};

// Initialises `msg` over `p` without copying (a gathered OutPayload is copied into one frame: a frame is one range).
// Throws std::runtime_error when ZeroMQ cannot make the message; `p`'s release has run then.
void init_out_msg(zmq_msg_t* msg, OutPayload& p);

// One event of a socket monitor (zmq_socket_monitor).
struct MonitorEvent {
  uint16_t event = 0;
  int32_t value = 0;  // the socket number for ACCEPTED and DISCONNECTED, a reason for a failed handshake
  std::string where;  // the endpoint
};

// The next event queued on the monitor's socket `mon`, without waiting.
std::optional<MonitorEvent> next_monitor_event(void* mon);

}  // namespace commsched::ps
