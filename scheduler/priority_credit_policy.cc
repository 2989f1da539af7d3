#include "scheduler/priority_credit_policy.h"

#include <algorithm>
#include <cstdlib>

namespace commsched {

PriorityCreditPolicy::PriorityCreditPolicy(uint64_t credit_bytes, uint64_t small_tensor_bytes, bool stall_guard)
    : credit_(credit_bytes), small_(small_tensor_bytes), stall_guard_(stall_guard) {}

void PriorityCreditPolicy::on_task_arrived(const TaskArrival& task, Nanos now) {
  queue_.push(task.parts, task.bytes);
  if (backward_start_ < 0) {
    backward_start_ = now;
    urgent_seq_ = UINT64_MAX;
    urgent_bytes_ = 0;
  }
  const auto g = endgame();
  if (g && now >= g->from && urgent_seq_ == UINT64_MAX) urgent_seq_ = task.seq;
  if (task.seq >= urgent_seq_) urgent_bytes_ += task.bytes;
}

void PriorityCreditPolicy::on_backward_done(Nanos now) {
  if (backward_start_ >= 0) backward_span_ = now - backward_start_;
  backward_start_ = -1;
}

// What was told so far was no backward's: it must neither start one nor wait for one's end.
void PriorityCreditPolicy::on_flush(Nanos /*now*/) { backward_start_ = -1; }

static bool exp_hold() {
  const char* v = std::getenv("COMMSCHED_EXP_HOLD");
  return v && *v == '1';
}

static bool exp_backlog() {
  const char* v = std::getenv("COMMSCHED_EXP_BACKLOG");
  return v && *v == '1';
}

uint64_t PriorityCreditPolicy::backlog_at(Nanos now) const {
  const double drained = rate_ * static_cast<double>(now - backlog_t_);
  return drained >= static_cast<double>(backlog_) ? 0 : backlog_ - static_cast<uint64_t>(drained);
}

uint64_t PriorityCreditPolicy::credit_for(Nanos now, const PartRef& top) const {
  static const bool hold = exp_hold();
  static const bool backlog = exp_backlog();
  if (hold && backward_start_ < 0 && urgent_bytes_ > 0 && top.seq < urgent_seq_) return 1;
  if (!backlog || rate_ <= 0) return credit_at(now);
  const auto g = endgame();
  if (!g || now < g->from || now >= g->until) return credit_;
  const double left = static_cast<double>(std::max<Nanos>(0, g->end - now));
  const double budget = rate_ * left - static_cast<double>(backlog_at(now));
  if (budget <= 0) return 1;
  return std::max<uint64_t>(1, std::min<uint64_t>(credit_, in_flight_ + static_cast<uint64_t>(budget)));
}

static double exp_factor() {
  const char* v = std::getenv("COMMSCHED_EXP_H");
  return v ? std::atof(v) : 1.0;
}

std::optional<PriorityCreditPolicy::Endgame> PriorityCreditPolicy::endgame() const {
  static const double f = exp_factor();
  if (!time_aware_ || credit_ == 0 || backward_start_ < 0 || backward_span_ == 0 || batch_time_ewma_ == 0 || f == 0)
    return std::nullopt;
  const Nanos drain = static_cast<Nanos>(f * batch_time_ewma_);
  const Nanos end = backward_start_ + backward_span_;
  return Endgame{end - drain, end, end + drain};
}

uint64_t PriorityCreditPolicy::credit_at(Nanos now) const {
  const auto g = endgame();
  if (!g || now < g->from || now >= g->until) return credit_;
  const Nanos left = std::max<Nanos>(0, g->end - now);
  const auto shrunk = static_cast<uint64_t>(static_cast<double>(credit_) * static_cast<double>(left) /
                                            static_cast<double>(g->end - g->from));
  return std::max<uint64_t>(shrunk, 1);  // 1 byte: one partition when nothing is in flight (fits)
}

void PriorityCreditPolicy::on_batch_done(const Batch& batch, Nanos now) {
  uint64_t done = 0;
  for (const PartRef& p : batch) {
    in_flight_ -= p.bytes;
    done += p.bytes;
    if (p.seq >= urgent_seq_) urgent_bytes_ -= p.bytes;
  }
  const auto g = endgame();
  const bool in_endgame = g && now >= g->from && now < g->until;
  if (saturated_ && !in_endgame && now > last_done_) {
    busy_bytes_ += static_cast<double>(done);
    busy_ns_ += static_cast<double>(now - last_done_);
    rate_ = busy_bytes_ / busy_ns_;
  }
  last_done_ = now;
  saturated_ = !queue_.empty();
  last_progress_ = now;
  if (batch.empty()) return;
  const PartRef& first = batch.front();
  auto it = std::find_if(dispatched_at_.begin(), dispatched_at_.end(),
                         [&](const InFlight& f) { return f.task_id == first.task_id && f.index == first.index; });
  if (it != dispatched_at_.end()) {
    const double took = static_cast<double>(now - it->at);
    batch_time_ewma_ = batch_time_ewma_ == 0 ? took : 0.875 * batch_time_ewma_ + 0.125 * took;
    dispatched_at_.erase(it);
  }
}

std::optional<Nanos> PriorityCreditPolicy::next_wakeup() const {
  if (queue_.empty() || in_flight_ == 0) return std::nullopt;
  std::optional<Nanos> at;
  if (stall_guard_) at = last_progress_ + stall_timeout();
  if (const auto g = endgame()) at = std::min(at.value_or(g->until), g->until);  // the full credit is back then
  return at;
}

void PriorityCreditPolicy::poll(Nanos now, std::vector<Batch>& out) {
  while (!queue_.empty()) {
    const uint64_t credit = credit_for(now, queue_.top().part);
    if (!fits(in_flight_, queue_.top().part.bytes, credit)) break;
    dispatch_head(now, credit, out);
  }
  if (stall_guard_ && !queue_.empty() && in_flight_ > 0 && now >= last_progress_ + stall_timeout()) {
    ++overdrafts_;
    last_progress_ = now;  // the next overdraft waits another stall time
    dispatch_head(now, credit_for(now, queue_.top().part), out);
  }
}

void PriorityCreditPolicy::dispatch_head(Nanos now, uint64_t credit, std::vector<Batch>& out) {
  {
    Entry head = queue_.top();
    queue_.pop();
    Batch batch{head.part};
    uint64_t batch_bytes = head.part.bytes;
    // Fuse the next most urgent small tensors while they fit both the fusion size and the credit.
    if (is_small(head)) {
      while (!queue_.empty() && is_small(queue_.top()) && batch_bytes + queue_.top().part.bytes <= small_ &&
             (in_flight_ == 0 || fits(in_flight_ + batch_bytes, queue_.top().part.bytes, credit))) {
        batch_bytes += queue_.top().part.bytes;
        batch.push_back(queue_.top().part);
        queue_.pop();
      }
    }
    if (in_flight_ == 0) last_progress_ = now;  // an idle policy has not stalled
    in_flight_ += batch_bytes;
    backlog_ = backlog_at(now) + batch_bytes;
    backlog_t_ = now;
    if (stall_guard_ || time_aware_) dispatched_at_.push_back({batch.front().task_id, batch.front().index, now});
    out.push_back(std::move(batch));
  }
}

}  // namespace commsched
