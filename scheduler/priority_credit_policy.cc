#include "scheduler/priority_credit_policy.h"

namespace commsched {

PriorityCreditPolicy::PriorityCreditPolicy(uint64_t credit_bytes, uint64_t small_tensor_bytes)
    : credit_(credit_bytes), small_(small_tensor_bytes) {}

void PriorityCreditPolicy::on_task_arrived(const TaskArrival& task, Nanos /*now*/) {
  for (const PartRef& p : task.parts) queue_.push(Entry{p, task.bytes});
}

void PriorityCreditPolicy::on_batch_done(const Batch& batch, Nanos /*now*/) {
  for (const PartRef& p : batch) in_flight_ -= p.bytes;
}

void PriorityCreditPolicy::poll(Nanos /*now*/, std::vector<Batch>& out) {
  while (!queue_.empty() && fits(queue_.top().part.bytes)) {
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
    in_flight_ += batch_bytes;
    out.push_back(std::move(batch));
  }
}

}  // namespace commsched
