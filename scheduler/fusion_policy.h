// FusionPolicy: Horovod's tensor fusion. A background loop wakes every `cycle`; at each tick it takes every tensor that
// became ready since the last tick and fuses them, in readiness order, into batches of at most `fusion_bytes` (a
// tensor larger than the threshold goes alone). The tick's batches then go out one after another, one in flight at a
// time, as Horovod's single background thread performs them; the next tick comes `cycle` after the previous one or
// when the last batch completes, whichever is later (Horovod sleeps only for what is left of the cycle).
#pragma once

#include <deque>
#include <optional>
#include <vector>

#include "scheduler/policy.h"

namespace commsched {

class FusionPolicy final : public Policy {
 public:
  // fusion_bytes == 0: no fusion (every tensor is its own batch, still cycle-paced). cycle must be >= 0.
  FusionPolicy(uint64_t fusion_bytes, Nanos cycle);

  std::string_view name() const override { return "fusion"; }
  bool splits_tasks() const override { return false; }
  void on_task_arrived(const TaskArrival& task, Nanos now) override;
  void on_batch_done(const Batch& batch, Nanos now) override;
  void poll(Nanos now, std::vector<Batch>& out) override;
  std::optional<Nanos> next_wakeup() const override;
  size_t queued_partitions() const override;
  uint64_t bytes_in_flight() const override { return in_flight_; }

 private:
  bool busy() const { return in_flight_batches_ > 0 || !tick_batches_.empty(); }
  // The first tick at or after `now` on the loop's schedule.
  Nanos tick_at_or_after(Nanos now) const;
  void fuse_pending();

  uint64_t fusion_bytes_;
  Nanos cycle_;
  std::vector<PartRef> pending_;       // ready, waiting for the next tick (readiness order)
  std::deque<Batch> tick_batches_;     // formed at the last tick, not yet dispatched
  std::optional<Nanos> last_tick_;     // when the loop last took tensors
  std::optional<Nanos> scheduled_;     // the tick that will take the pending tensors, once fixed by poll
  Nanos idle_since_ = 0;
  Nanos now_ = 0;                      // the latest time told (next_wakeup has no `now` of its own)
  size_t in_flight_batches_ = 0;
  uint64_t in_flight_ = 0;
};

}  // namespace commsched
