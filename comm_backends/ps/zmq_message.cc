#include "comm_backends/ps/zmq_message.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <utility>

#include "scheduler/tsan_handoff.h"

namespace commsched::ps {
namespace {

// ZeroMQ calls release_payload on its I/O thread, after a hand-off through its own pipe that TSan cannot see.
void release_payload(void* /*data*/, void* hint) {
  taken_over(hint);
  auto* fn = static_cast<std::function<void()>*>(hint);
  if (*fn) (*fn)();
  delete fn;
}

}  // namespace

std::string zmq_err(const std::string& what) { return what + ": " + zmq_strerror(zmq_errno()); }

ZmqPayload::ZmqPayload(zmq_msg_t* m) {
  zmq_msg_init(&msg_);
  zmq_msg_move(&msg_, m);
}

ZmqPayload::~ZmqPayload() { zmq_msg_close(&msg_); }

std::span<const std::byte> ZmqPayload::bytes() const {
  auto* m = const_cast<zmq_msg_t*>(&msg_);
  return {static_cast<const std::byte*>(zmq_msg_data(m)), zmq_msg_size(m)};
}

void init_out_msg(zmq_msg_t* msg, OutPayload& p) {
  if (!p.pieces.empty()) {  // a frame is one range: gathered here, where the caller would have copied them anyway
    if (zmq_msg_init_size(msg, p.size) != 0) throw std::runtime_error(zmq_err("zmq_msg_init_size"));
    auto* at = static_cast<std::byte*>(zmq_msg_data(msg));
    for (const auto& s : p.pieces) at = std::copy(s.begin(), s.end(), at);
    if (p.release) std::exchange(p.release, nullptr)();
    return;
  }
  if (p.size == 0) {
    zmq_msg_init(msg);
    if (p.release) p.release();
    return;
  }
  auto* hint = new std::function<void()>(std::move(p.release));
  handed_over(hint);
  if (zmq_msg_init_data(msg, const_cast<std::byte*>(p.data), p.size, release_payload, hint) != 0) {
    release_payload(nullptr, hint);
    throw std::runtime_error(zmq_err("zmq_msg_init_data"));
  }
}

std::optional<MonitorEvent> next_monitor_event(void* mon) {
  zmq_msg_t ev, addr;
  zmq_msg_init(&ev);
  if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&ev);
    return std::nullopt;
  }
  MonitorEvent e;
  if (zmq_msg_size(&ev) >= 6) {  // a 16-bit event, then a 32-bit value
    std::memcpy(&e.event, zmq_msg_data(&ev), 2);
    std::memcpy(&e.value, static_cast<char*>(zmq_msg_data(&ev)) + 2, 4);
  }
  zmq_msg_init(&addr);
  zmq_msg_recv(&addr, mon, 0);  // the endpoint, sent with the event
  e.where.assign(static_cast<char*>(zmq_msg_data(&addr)), zmq_msg_size(&addr));
  zmq_msg_close(&ev);
  zmq_msg_close(&addr);
  return e;
}

}  // namespace commsched::ps
