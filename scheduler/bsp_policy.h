// BspPolicy: bulk-synchronous communication. Nothing moves while backward runs; at the end of backward every whole
// tensor goes out at once, most urgent first, with no credit limit. The baseline that overlaps nothing.
#pragma once

#include <vector>

#include "scheduler/policy.h"

namespace commsched {

class BspPolicy final : public Policy {
 public:
  BspPolicy() = default;

  std::string_view name() const override { return "bsp"; }
  bool splits_tasks() const override { return false; }
  void on_task_arrived(const TaskArrival& task, Nanos now) override;
  void on_batch_done(const Batch& batch, Nanos now) override;
  // Releases everything told so far; tasks told later wait for the next backward_done.
  void on_backward_done(Nanos now) override;
  // Releases everything told so far, as at the end of backward.
  void on_flush(Nanos now) override { on_backward_done(now); }
  void poll(Nanos now, std::vector<Batch>& out) override;
  size_t queued_partitions() const override { return held_.size() + released_.size(); }
  uint64_t bytes_in_flight() const override { return in_flight_; }

 private:
  std::vector<PartRef> held_;      // told during the current backward
  std::vector<PartRef> released_;  // released by backward_done, sorted most urgent first
  uint64_t in_flight_ = 0;
};

}  // namespace commsched
