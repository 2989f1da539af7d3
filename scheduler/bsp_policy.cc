#include "scheduler/bsp_policy.h"

#include <algorithm>
#include <tuple>

namespace commsched {

void BspPolicy::on_task_arrived(const TaskArrival& task, Nanos /*now*/) {
  held_.insert(held_.end(), task.parts.begin(), task.parts.end());
}

void BspPolicy::on_batch_done(const Batch& batch, Nanos /*now*/) {
  for (const PartRef& p : batch) in_flight_ -= p.bytes;
}

void BspPolicy::on_backward_done(Nanos /*now*/) {
  // Anything still unreleased from an earlier boundary (never polled) stays ahead; the sort keeps priority order.
  released_.insert(released_.end(), held_.begin(), held_.end());
  held_.clear();
  std::sort(released_.begin(), released_.end(), [](const PartRef& a, const PartRef& b) {
    return std::tie(a.priority, a.seq, a.offset) < std::tie(b.priority, b.seq, b.offset);
  });
}

void BspPolicy::poll(Nanos /*now*/, std::vector<Batch>& out) {
  for (const PartRef& p : released_) {
    out.push_back(Batch{p});
    in_flight_ += p.bytes;
  }
  released_.clear();
}

}  // namespace commsched
