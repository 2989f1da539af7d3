// PriorityCreditPolicy: the ByteScheduler policy. The most urgent partition (lowest priority value; ties: arrival,
// then offset) goes next, as long as the bytes in flight plus that partition stay within the credit. When nothing is in
// flight, the next partition always goes, so a partition larger than the credit cannot stall the queue.
//
// Our addition: tensors of at most `small_tensor_bytes` that are queued together (because the credit is used up) are
// fused into one batch, so the many tiny tensors of ResNet or BERT do not each pay a message's latency. Fusion never
// delays anything: a small tensor that finds credit free goes out at once, alone.
//
// The credit does not depend on the time. A credit that shrank over the last stretch of the backward, so that the
// gradients the next forward needs first (produced last) met empty queues, was measured and not kept (bench/RESULTS.md,
// session 23): with symmetric workers it gained 1-4%, but with every PS worker simulated the period stayed (the sums
// wait for the slowest worker's push at the servers' first-come-first-served downlinks, which one worker's credit
// does not order): faster in 12 of 84 grid cells, slower in 33, by up to 2.6%.
#pragma once

#include <functional>
#include <deque>
#include <vector>

#include "scheduler/part_queue.h"
#include "scheduler/policy.h"

namespace commsched {

class PriorityCreditPolicy final : public Policy {
 public:
  // credit_bytes == 0: no limit. small_tensor_bytes == 0: no fusion.
  explicit PriorityCreditPolicy(uint64_t credit_bytes, uint64_t small_tensor_bytes = 0, bool stall_guard = true);

  std::string_view name() const override { return "bytescheduler"; }
  void on_task_arrived(const TaskArrival& task, Nanos now) override;
  void on_batch_done(const Batch& batch, Nanos now) override;
  // The credit and the fusion bound; queued tensors are fused by the new bound from the next dispatch on.
  void set_knobs(const Knobs& k) override {
    credit_ = k.credit_bytes;
    small_ = k.small_tensor_bytes;
  }
  void on_global_order() override { stall_guard_ = false; }
  void poll(Nanos now, std::vector<Batch>& out) override;
  std::optional<Nanos> next_wakeup() const override;
  size_t queued_partitions() const override { return queue_.size(); }
  uint64_t bytes_in_flight() const override { return in_flight_; }

  uint64_t credit_bytes() const { return credit_; }
  uint64_t small_tensor_bytes() const { return small_; }
  uint64_t overdrafts() const { return overdrafts_; }

 private:
  using Entry = PartQueue::Entry;
  bool fits(uint64_t bytes) const { return in_flight_ == 0 || credit_ == 0 || in_flight_ + bytes <= credit_; }
  bool is_small(const Entry& e) const { return small_ != 0 && e.task_bytes <= small_; }

  Nanos stall_timeout() const { return 2 * static_cast<Nanos>(batch_time_ewma_) + 1'000'000; }
  void dispatch_head(Nanos now, std::vector<Batch>& out);

  uint64_t credit_;
  uint64_t small_;
  bool stall_guard_;
  Nanos last_progress_ = 0;
  double batch_time_ewma_ = 0;
  uint64_t overdrafts_ = 0;
  // When each batch in flight left, by its first partition, in dispatch order. Batches mostly finish in that order,
  // so the search from the front stops at once; a flat queue instead of a hash table, because the simulator runs
  // hundreds of these policies at once and a hash lookup (a division and a node per batch) missed the cache on most
  // of them (a quarter of a 256-worker simulation's time).
  struct InFlight {
    uint64_t task_id;
    uint32_t index;
    Nanos at;
  };
  std::deque<InFlight> dispatched_at_;
  uint64_t in_flight_ = 0;
  PartQueue queue_;
};

}  // namespace commsched
