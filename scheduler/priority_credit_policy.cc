#include "scheduler/priority_credit_policy.h"

#include <algorithm>

namespace commsched {

PriorityCreditPolicy::PriorityCreditPolicy(uint64_t credit_bytes, uint64_t small_tensor_bytes, bool stall_guard)
    : credit_(credit_bytes), small_(small_tensor_bytes), stall_guard_(stall_guard) {}

void PriorityCreditPolicy::on_task_arrived(const TaskArrival& task, Nanos /*now*/) {
  queue_.push(task.parts, task.bytes);
}

void PriorityCreditPolicy::on_batch_done(const Batch& batch, Nanos now) {
  for (const PartRef& p : batch) in_flight_ -= p.bytes;
  last_progress_ = now;
  if (batch.empty()) return;
  const PartRef& first = batch.front();
  auto it = std::find_if(dispatched_at_.begin(), dispatched_at_.end(),
                         [&](const InFlight& f) { return f.task_id == first.task_id && f.index == first.index; });
  if (it != dispatched_at_.end()) {
    const double took = static_cast<double>(now - it->at);
    batch_time_ewma_ = batch_time_ewma_ == 0 ? took : 0.875 * batch_time_ewma_ + 0.125 * took;
    dispatched_at_.erase(it);
  }
}

std::optional<Nanos> PriorityCreditPolicy::next_wakeup() const {
  if (!stall_guard_ || queue_.empty() || in_flight_ == 0) return std::nullopt;
  return last_progress_ + stall_timeout();
}

void PriorityCreditPolicy::poll(Nanos now, std::vector<Batch>& out) {
  while (!queue_.empty() && fits(queue_.top().part.bytes)) dispatch_head(now, out);
  if (stall_guard_ && !queue_.empty() && in_flight_ > 0 && now >= last_progress_ + stall_timeout()) {
    ++overdrafts_;
    last_progress_ = now;  // the next overdraft waits another stall time
    dispatch_head(now, out);
  }
}

void PriorityCreditPolicy::dispatch_head(Nanos now, std::vector<Batch>& out) {
  {
    Entry head = queue_.top();
    queue_.pop();
    Batch batch{head.part};
    uint64_t batch_bytes = head.part.bytes;
    // Fuse the next most urgent small tensors while they fit both the fusion size and the credit.
    if (is_small(head)) {
      while (!queue_.empty() && is_small(queue_.top()) && batch_bytes + queue_.top().part.bytes <= small_ &&
             (credit_ == 0 || in_flight_ + batch_bytes + queue_.top().part.bytes <= credit_ || in_flight_ == 0)) {
        batch_bytes += queue_.top().part.bytes;
        batch.push_back(queue_.top().part);
        queue_.pop();
      }
    }
    if (in_flight_ == 0) last_progress_ = now;  // an idle policy has not stalled
    in_flight_ += batch_bytes;
    if (stall_guard_) dispatched_at_.push_back({batch.front().task_id, batch.front().index, now});
    out.push_back(std::move(batch));
  }
}

}  // namespace commsched
