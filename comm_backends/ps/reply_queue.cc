#include "comm_backends/ps/reply_queue.h"

#include <utility>

namespace commsched::ps {

ReplyQueue::ReplyQueue(control::Van& van, uint64_t max_overtakes, std::function<void()> wake, uint64_t window_bytes)
    : van_(van), window_(window_bytes), shared_(std::make_shared<Shared>()) {
  if (max_overtakes > 0) ready_ = std::make_unique<ReplyOrder<Reply>>(max_overtakes);
  shared_->wake = std::move(wake);
}

ReplyQueue::~ReplyQueue() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->wake = nullptr;  // the transport may release payloads later, while it closes
}

void ReplyQueue::add(PeerId peer, const Header& h, OutPayload payload) {
  Reply r{peer, h, std::move(payload)};
  const bool receipt = h.type == MsgType::received;
  // A receipt goes at once: the rule sends receipts first anyway, it holds no payload the window counts, and what the
  // server sends straight through the Van (an error naming the culprit) must not overtake the receipt of its request
  // (the worker fails a receipt for a request already answered as unknown).
  if (!ready_ || receipt) return hand_over(std::move(r));
  ready_->push(std::move(r), receipt, h.priority);
  flush();
}

void ReplyQueue::flush() {
  if (!ready_) return;
  for (;;) {
    while (!ready_->empty() && transport_has_room()) hand_over(ready_->pop());
    if (ready_->empty()) return shared_->room.stop_waiting();
    if (!shared_->room.room_came([this] { return transport_has_room(); })) return;  // a release will wake this thread
  }
}

bool ReplyQueue::transport_has_room() const {
  return shared_->in_flight.load() < window_ || shared_->payloads.load() < kMinInFlight;
}

void ReplyQueue::hand_over(Reply r) {
  const uint64_t bytes = r.payload.size;
  if (ready_ && bytes > 0) {  // counted until the transport lets go of it (waking the I/O thread if replies wait)
    shared_->in_flight.fetch_add(bytes);
    shared_->payloads.fetch_add(1);
    r.payload.release = [shared = shared_, bytes, inner = std::move(r.payload.release)] {
      if (inner) inner();
      shared->in_flight.fetch_sub(bytes);
      shared->payloads.fetch_sub(1);
      if (!shared->room.released()) return;  // nothing waits for the room this made
      std::lock_guard<std::mutex> lock(shared->mu);
      if (shared->wake) shared->wake();
    };
  }
  van_.send(r.peer, r.h, std::move(r.payload));
}

}  // namespace commsched::ps
