#include "scheduler/fifo_policy.h"

namespace commsched {

void FifoPolicy::on_task_arrived(const TaskArrival& task, Nanos /*now*/) {
  for (const PartRef& p : task.parts) queue_.push_back(p);
}

void FifoPolicy::on_batch_done(const Batch& batch, Nanos /*now*/) {
  for (const PartRef& p : batch) in_flight_ -= p.bytes;
}

void FifoPolicy::poll(Nanos /*now*/, std::vector<Batch>& out) {
  while (!queue_.empty()) {
    in_flight_ += queue_.front().bytes;
    out.push_back(Batch{queue_.front()});
    queue_.pop_front();
  }
}

}  // namespace commsched
