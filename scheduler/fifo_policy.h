// FifoPolicy: wait-free back-propagation (WFBP), the baseline every framework ships. Whole tensors go out in the order
// they became ready, at once, with no credit limit.
#pragma once

#include <deque>

#include "scheduler/policy.h"

namespace commsched {

class FifoPolicy final : public Policy {
 public:
  std::string_view name() const override { return "wfbp"; }
  bool splits_tasks() const override { return false; }
  void on_task_arrived(const TaskArrival& task, Nanos now) override;
  void on_batch_done(const Batch& batch, Nanos now) override;
  void poll(Nanos now, std::vector<Batch>& out) override;
  size_t queued_partitions() const override { return queue_.size(); }
  uint64_t bytes_in_flight() const override { return in_flight_; }

 private:
  std::deque<PartRef> queue_;
  uint64_t in_flight_ = 0;
};

}  // namespace commsched
