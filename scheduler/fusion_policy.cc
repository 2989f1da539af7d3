#include "scheduler/fusion_policy.h"

#include <algorithm>
#include <string>

namespace commsched {

FusionPolicy::FusionPolicy(uint64_t fusion_bytes, Nanos cycle) : fusion_bytes_(fusion_bytes), cycle_(cycle) {
  if (cycle < 0) throw InvalidArgument("FusionPolicy: fusion cycle must be >= 0 ns, got " + std::to_string(cycle));
}

void FusionPolicy::on_task_arrived(const TaskArrival& task, Nanos now) {
  now_ = std::max(now_, now);
  pending_.insert(pending_.end(), task.parts.begin(), task.parts.end());
}

void FusionPolicy::on_batch_done(const Batch& batch, Nanos now) {
  now_ = std::max(now_, now);
  for (const PartRef& p : batch) in_flight_ -= p.bytes;
  --in_flight_batches_;
  if (!busy()) idle_since_ = now;
}

Nanos FusionPolicy::tick_at_or_after(Nanos now) const {
  if (!last_tick_) return now;  // the loop has never run: it takes the first tensors at once
  // After a busy period the loop runs again when the cycle since the last tick has passed or at once if it has;
  // while idle it keeps waking every cycle from there.
  Nanos tick = std::max(*last_tick_ + cycle_, idle_since_);
  if (tick >= now || cycle_ == 0) return std::max(tick, now);
  const Nanos missed = (now - tick + cycle_ - 1) / cycle_;
  return tick + missed * cycle_;
}

void FusionPolicy::fuse_pending() {
  Batch current;
  uint64_t current_bytes = 0;
  for (const PartRef& p : pending_) {
    const bool fits = fusion_bytes_ != 0 && current_bytes + p.bytes <= fusion_bytes_;
    if (!current.empty() && !fits) {
      tick_batches_.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(p);
    current_bytes += p.bytes;
  }
  if (!current.empty()) tick_batches_.push_back(std::move(current));
  pending_.clear();
}

void FusionPolicy::poll(Nanos now, std::vector<Batch>& out) {
  now_ = std::max(now_, now);
  if (in_flight_batches_ > 0) return;
  if (tick_batches_.empty()) {
    if (pending_.empty()) return;
    // Fix the tick once: a real clock polls a little after the wake-up it asked for, and recomputing "the tick at
    // or after now" then would always find the next cycle and never take the tensors.
    if (!scheduled_) scheduled_ = tick_at_or_after(now);
    if (now < *scheduled_) return;
    last_tick_ = *scheduled_;
    scheduled_.reset();
    fuse_pending();
  }
  Batch next = std::move(tick_batches_.front());
  tick_batches_.pop_front();
  for (const PartRef& p : next) in_flight_ += p.bytes;
  ++in_flight_batches_;
  out.push_back(std::move(next));
}

std::optional<Nanos> FusionPolicy::next_wakeup() const {
  if (busy() || pending_.empty()) return std::nullopt;  // a completion or an arrival will call poll
  return scheduled_ ? *scheduled_ : tick_at_or_after(now_);
}

size_t FusionPolicy::queued_partitions() const {
  size_t n = pending_.size();
  for (const Batch& b : tick_batches_) n += b.size();
  return n;
}

}  // namespace commsched
