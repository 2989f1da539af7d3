// MergedGradientPolicy: MG-WFBP (Shi et al., "MG-WFBP: Efficient Data Communication for Distributed Synchronous SGD
// Algorithms", INFOCOM 2019). Sending a message costs alpha + beta * bytes. In the first iteration the policy behaves as
// WFBP (every tensor goes out when it is ready) and learns when each gradient becomes ready, relative to the first one
// of the iteration; backward_done ends the iteration and the policy plans merge groups: walking the gradients in ready
// order, it merges the next gradient into the current group when sending both together (after waiting for the later
// one) finishes strictly earlier than sending the group now and the next gradient on its own. From then on a group
// goes out as one fused Batch as soon as its last member arrives. Tasks are identified across iterations by priority.
#pragma once

#include <map>
#include <optional>
#include <vector>

#include "scheduler/policy.h"

namespace commsched {

class MergedGradientPolicy final : public Policy {
 public:
  // alpha_s: per-message latency in seconds; beta_s_per_byte: seconds per byte (1 / bandwidth). Both >= 0.
  MergedGradientPolicy(double alpha_s, double beta_s_per_byte);

  std::string_view name() const override { return "mgwfbp"; }
  bool splits_tasks() const override { return false; }
  void on_task_arrived(const TaskArrival& task, Nanos now) override;
  void on_batch_done(const Batch& batch, Nanos now) override;
  void on_backward_done(Nanos now) override;
  // Before the plan: forgets what it observed since the iteration began (those tasks were not gradients of a
  // backward; they already went out WFBP-style). After: sends incomplete groups as they are.
  void on_flush(Nanos now) override;
  void poll(Nanos now, std::vector<Batch>& out) override;
  size_t queued_partitions() const override;
  uint64_t bytes_in_flight() const override { return in_flight_; }

  // True once the first iteration has been observed and the merge plan is in force.
  bool learned() const { return learned_; }
  // The planned groups, in send order, each as its members' priorities (ready order). Empty before learning.
  std::vector<std::vector<int32_t>> merge_groups() const;

 private:
  struct Observed {       // one priority's gradients in the learning iteration
    Nanos ready = 0;      // ns after the iteration's first gradient
    uint64_t bytes = 0;
    uint32_t tasks = 0;   // tasks seen with this priority (a layer may submit several)
  };
  struct Group {
    std::vector<int32_t> priorities;
    uint32_t expected_tasks = 0;
    uint32_t arrived_tasks = 0;
    Batch parts;
  };

  void observe(const TaskArrival& task, Nanos now);
  void plan();
  // Cost model: when a message of `bytes` started at `start` completes.
  double finish(double start, uint64_t bytes) const { return start + alpha_ns_ + beta_ns_per_byte_ * bytes; }
  void release(Group& g);

  double alpha_ns_;
  double beta_ns_per_byte_;
  bool learned_ = false;
  std::optional<Nanos> iteration_start_;
  std::map<int32_t, Observed> observed_;
  std::vector<Group> groups_;
  std::map<int32_t, size_t> group_of_;  // priority -> index into groups_
  std::vector<Batch> ready_;            // complete groups (or WFBP singles) waiting for poll
  uint64_t in_flight_ = 0;
};

}  // namespace commsched
