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
  while (ready_ && !ready_->empty() && transport_has_room()) hand_over(ready_->pop());
}

bool ReplyQueue::transport_has_room() const {
  return shared_->in_flight.load(std::memory_order_acquire) < window_ ||
         shared_->payloads.load(std::memory_order_acquire) < kMinInFlight;
}

void ReplyQueue::hand_over(Reply r) {
  const uint64_t bytes = r.payload.size;
  if (ready_ && bytes > 0) {  // counted until the transport lets go of it, which wakes the I/O thread to send more
    shared_->in_flight.fetch_add(bytes, std::memory_order_acq_rel);
    shared_->payloads.fetch_add(1, std::memory_order_acq_rel);
    r.payload.release = [shared = shared_, bytes, inner = std::move(r.payload.release)] {
      if (inner) inner();
      shared->in_flight.fetch_sub(bytes, std::memory_order_acq_rel);
      shared->payloads.fetch_sub(1, std::memory_order_acq_rel);
      std::lock_guard<std::mutex> lock(shared->mu);
      if (shared->wake) shared->wake();
    };
  }
  van_.send(r.peer, r.h, std::move(r.payload));
}

}  // namespace commsched::ps
