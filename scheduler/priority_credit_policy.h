// PriorityCreditPolicy: the ByteScheduler policy. The most urgent partition (lowest priority value; ties: arrival,
// then offset) goes next, as long as the bytes in flight plus that partition stay within the credit. When nothing is in
// flight, the next partition always goes, so a partition larger than the credit cannot stall the queue.
//
// Our addition: tensors of at most `small_tensor_bytes` that are queued together (because the credit is used up) are
// fused into one batch, so the many tiny tensors of ResNet or BERT do not each pay a message's latency. Fusion never
// delays anything: a small tensor that finds credit free goes out at once, alone.
//
// And a time-aware credit: the backward produces the gradients the next forward needs first (conv1's, the
// embedding's) last, and a full credit has by then filled the first-come-first-served queues below the policy (the
// worker's uplink, the servers' downlinks), so the first-needed gradient waits for a whole credit's worth to drain
// (bench/RESULTS.md, session 22: 3-5.5 ms at ResNet-50's end of backward, about the credit's drain time). The policy
// learns each backward's length (its first gradient to on_backward_done) and, over the last stretch of the next one
// before its expected end, admits only what drains by then: the credit shrinks to credit x time-left / drain-time
// (the drain time: a batch's measured time in flight, which a full window sets), never below one partition. Once
// the backward ends (or its expected end is a drain time past with no end: a slower backward) the full credit is
// back, so nothing waits when nothing urgent is coming. Not under a global order.
// EXPERIMENT (session 23, reverted in the next commit; bench/RESULTS.md): COMMSCHED_EXP_H scales the stretch (the
// drain time x H, default 1; 0: off, the old credit); COMMSCHED_EXP_HOLD=1 also keeps the other tensors at one
// partition after the backward until the stretch's tensors are done; COMMSCHED_EXP_BACKLOG=1 admits instead what a
// fluid model of the worker's queue (the receipt rate learned while credit-bound) drains by the expected end.
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
  void on_backward_done(Nanos now) override;
  void on_flush(Nanos now) override;
  // The credit and the fusion bound; queued tensors are fused by the new bound from the next dispatch on.
  void set_knobs(const Knobs& k) override {
    credit_ = k.credit_bytes;
    small_ = k.small_tensor_bytes;
  }
  void on_global_order() override {
    stall_guard_ = false;
    time_aware_ = false;
  }
  void poll(Nanos now, std::vector<Batch>& out) override;
  std::optional<Nanos> next_wakeup() const override;
  size_t queued_partitions() const override { return queue_.size(); }
  uint64_t bytes_in_flight() const override { return in_flight_; }

  uint64_t credit_bytes() const { return credit_; }
  uint64_t small_tensor_bytes() const { return small_; }
  uint64_t overdrafts() const { return overdrafts_; }
  // The credit poll() applies at `now` (the time-aware credit; credit_bytes() outside the end of a backward).
  uint64_t credit_at(Nanos now) const;

 private:
  using Entry = PartQueue::Entry;
  static bool fits(uint64_t in_flight, uint64_t bytes, uint64_t credit) {
    return in_flight == 0 || credit == 0 || in_flight + bytes <= credit;
  }
  // The stretch before the expected end of this backward in which the credit shrinks, and its end: [from, until).
  struct Endgame {
    Nanos from = 0, end = 0, until = 0;
  };
  std::optional<Endgame> endgame() const;
  bool is_small(const Entry& e) const { return small_ != 0 && e.task_bytes <= small_; }

  Nanos stall_timeout() const { return 2 * static_cast<Nanos>(batch_time_ewma_) + 1'000'000; }
  void dispatch_head(Nanos now, uint64_t credit, std::vector<Batch>& out);

  uint64_t credit_;
  uint64_t small_;
  bool stall_guard_;
  bool time_aware_ = true;
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
  // The current backward's first gradient (-1: none told since the last backward's end) and the last backward's
  // length (0: none measured yet).
  Nanos backward_start_ = -1;
  Nanos backward_span_ = 0;
  uint64_t urgent_seq_ = UINT64_MAX;
  uint64_t urgent_bytes_ = 0;
  uint64_t credit_for(Nanos now, const PartRef& top) const;
  uint64_t backlog_at(Nanos now) const;
  uint64_t backlog_ = 0;
  Nanos backlog_t_ = 0;
  double rate_ = 0, busy_bytes_ = 0, busy_ns_ = 0;
  Nanos last_done_ = 0;
  bool saturated_ = false;
  uint64_t in_flight_ = 0;
  PartQueue queue_;
};

}  // namespace commsched
