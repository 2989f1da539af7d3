// ForwardPolicy: what an engine runs over a backend whose order is decided on rank 0 over every rank's readiness (a
// collective, BackendCapabilities::global_order). The engine's own Policy orders there (scheduler/global_order.h);
// here each task's partitions go to the backend the moment they arrive, one batch per task, with no credit: a second
// policy deciding when to send would only delay the report that lets rank 0 decide.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "scheduler/policy.h"

namespace commsched {

class ForwardPolicy final : public Policy {
 public:
  // The name and partitioning of the policy that orders for this engine (its tasks are split as that one splits them).
  ForwardPolicy(std::string ordering_policy, bool splits) : name_(std::move(ordering_policy)), splits_(splits) {}

  std::string_view name() const override { return name_; }
  bool splits_tasks() const override { return splits_; }
  void on_task_arrived(const TaskArrival& task, Nanos /*now*/) override {
    ready_.emplace_back(task.parts.begin(), task.parts.end());
    queued_ += task.parts.size();
  }
  void on_batch_done(const Batch& batch, Nanos /*now*/) override {
    for (const PartRef& p : batch) in_flight_ -= p.bytes;
  }
  void poll(Nanos /*now*/, std::vector<Batch>& out) override {
    for (Batch& b : ready_) {
      for (const PartRef& p : b) in_flight_ += p.bytes;
      out.push_back(std::move(b));
    }
    ready_.clear();
    queued_ = 0;
  }
  size_t queued_partitions() const override { return queued_; }
  uint64_t bytes_in_flight() const override { return in_flight_; }

 private:
  std::string name_;
  bool splits_;
  std::vector<Batch> ready_;
  size_t queued_ = 0;
  uint64_t in_flight_ = 0;
};

}  // namespace commsched
