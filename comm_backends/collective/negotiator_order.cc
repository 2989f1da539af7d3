// The order's path through a rank's negotiator: submissions reported to rank 0 (from the submitting thread, or as one
// burst from the negotiator thread), iteration marks counted behind them, rank 0's ordering round (the policy handed
// over, its knobs, completions, the order published to every rank), and orders and errors applied here. Connections
// are negotiator.cc's, the rounds (the loop, or a helping caller) negotiator_rounds.cc's; a peer's loss, keep-alive
// and shutdown negotiator_faults.cc's.
#include "comm_backends/collective/negotiator.h"

#include <utility>

#include "comm_backends/collective/negotiator_detail.h"

namespace commsched::collective {
namespace {

using detail::now_ns;
using detail::wake;

// Submissions closer together than this are a burst (an engine dispatching several batches at once).
constexpr int64_t kBurstGapNs = 100'000;

}  // namespace

void Negotiator::submit(std::vector<Submission> subs) {
  if (coordinator_ && step_on_caller(subs)) return;
  std::vector<std::pair<uint64_t, Status>> failed;
  bool to_thread = false;
  {
    std::lock_guard lock(mu_);
    if (dead_ || stopping_) {
      const Status st = dead_ ? dead_status_ : Status::Error("negotiator is shutting down", Status::Code::cancelled);
      for (const auto& s : subs) failed.emplace_back(s.token, st);
    } else if (coordinator_ || !inbox_.empty() ||
               (!pending_.empty() && now_ns() - last_inline_report_ns_ < kBurstGapNs)) {
      // Rank 0: the negotiator thread is mid-step; it takes the inbox next. Elsewhere this is the rest of a burst
      // (what was reported just before still waits for its order): the negotiator thread sends it as one report, so
      // rank 0 sees the partitions ready together and can fuse them.
      for (auto& s : subs) inbox_.push_back(std::move(s));
      to_thread = true;
    } else {
      // Straight to rank 0 from this thread: waking the negotiator thread to send it would add a hand-off.
      last_inline_report_ns_ = now_ns();
      const auto reports = reports_locked(subs, failed);
      if (!reports.empty()) send_to_coordinator_async(encode_ready(reports));
    }
  }
  for (const auto& [token, st] : failed) cb_.fail(token, st);
  if (to_thread) wake(wake_.get());
}

bool Negotiator::step_on_caller(std::vector<Submission>& subs, std::optional<bool> backward_mark) {
  if (state_owner_.load() == std::this_thread::get_id()) return false;  // a callback from inside a step
  StateLock state(*this, std::try_to_lock);
  if (!state.owns() || finished_ || relay_.stopped()) return false;
  std::vector<std::pair<uint64_t, Status>> failed;
  std::vector<ReadyReport> reports;
  std::optional<IterationMark> mark;
  {
    std::lock_guard lock(mu_);
    if (dead_ || stopping_ || !inbox_.empty() || !inbox_marks_.empty()) return false;  // earlier ones are told first
    reports = reports_locked(subs, failed);
    if (backward_mark) mark = IterationMark{*backward_mark, submitted_.load()};
  }
  try {
    if (!reports.empty()) {
      GlobalOrderOutput out;
      note_ready(0, reports);
      coordinator_->on_ready(0, reports, out);
      publish(out);
    }
    if (mark) coordinator_->on_mark(0, *mark);
    // Reports that came while the negotiator thread runs a collective count now: the next order reaches the peers
    // before the running collective ends.
    read_waiting_peers();
    if (!finished_) coordinator_round();
  } catch (const std::exception& e) {
    fail_broken(e);
  }
  // The negotiator thread runs rank 0's copy of the order (the peers have theirs already).
  const bool for_thread = !ready_groups_.empty() || finished_;
  state.unlock();
  for (const auto& [token, st] : failed) cb_.fail(token, st);
  if (for_thread) wake(wake_.get());
  return true;
}

void Negotiator::coordinator_round() {
  coordinator_->take_from(order_inbox_);  // the policy and knobs an engine handed over
  for (uint64_t done = completed_groups_.exchange(0); done > 0; --done) coordinator_->on_group_done(now_ns());
  if (relay_.stopped()) return;
  GlobalOrderOutput out;
  coordinator_->flush(now_ns(), out);
  publish(out);
}

void Negotiator::mark(bool backward) {
  std::vector<Submission> none;
  if (coordinator_ && step_on_caller(none, backward)) return;  // rank 0: told on this thread, like a submission
  bool to_thread = false;
  {
    std::lock_guard lock(mu_);
    if (dead_ || stopping_) return;
    if (coordinator_ || !inbox_.empty()) {
      // Rank 0 (its negotiator thread mid-step) tells its coordinator on that thread; elsewhere the mark follows the
      // burst waiting in the inbox. Either way it counts what is reported before it, once that is (take_inbox).
      inbox_marks_.emplace_back(inbox_.size(), backward);
      to_thread = true;
    } else {
      send_to_coordinator_async(encode_mark({backward, submitted_.load()}));
    }
  }
  if (to_thread) wake(wake_.get());
}

std::vector<ReadyReport> Negotiator::reports_locked(std::span<Submission> subs,
                                                    std::vector<std::pair<uint64_t, Status>>& failed) {
  std::vector<ReadyReport> reports;
  reports.reserve(subs.size());
  for (auto& s : subs) {
    const Slot slot{s.desc.key, s.desc.offset};
    if (pending_.count(slot)) {
      failed.emplace_back(s.token, Status::Error("task '" + s.name + "': partition at offset " + std::to_string(s.desc.offset) +
                                                     " submitted again while still in flight", Status::Code::invalid));
      continue;
    }
    pending_.emplace(slot, Local{s.token, s.round, s.desc});
    ReadyReport rep;
    rep.round = s.round;
    rep.priority = s.priority;
    auto c = cache_.find(slot);
    if (c != cache_.end() && c->second.desc == s.desc) {
      rep.cache_id = c->second.id;
      ++cached_reports_;
    } else {
      rep.desc = s.desc;
      rep.name = std::move(s.name);
    }
    reports.push_back(std::move(rep));
  }
  submitted_ += reports.size();
  return reports;
}

void Negotiator::publish(GlobalOrderOutput& out) {
  if (out.empty()) return;
  std::string frames;
  if (!out.order.empty()) frames += encode_order(out.order);
  for (const auto& e : out.errors) frames += encode_error(e);
  if (out.all_joined) frames += encode_joined(*out.all_joined);  // after the order: its stand-ins come first
  // Peers first, so their collectives can start while rank 0 applies its own copy.
  for (int r = 1; r < opts_.size; ++r)
    if (peers_[r].fd.valid() && !peers_[r].closed && !bye_.left(static_cast<control::GoodbyeBarrier::Id>(r)))
      send_to(r, frames);
  if (!out.order.empty()) apply_order(out.order);
  for (const auto& e : out.errors) apply_error(e);
  if (out.all_joined) finish_join(*out.all_joined);
}

void Negotiator::apply_order(const OrderMsg& m) {
  ++orders_;
  std::lock_guard lock(mu_);
  for (const auto& d : m.defines) {
    const Slot slot{d.desc.key, d.desc.offset};
    if (cache_slots_.size() <= d.cache_id) cache_slots_.resize(d.cache_id + 1, Slot{0, 0});
    cache_slots_[d.cache_id] = slot;
    cache_[slot] = CacheSlot{d.cache_id, d.desc};
  }
  for (const auto& g : m.groups) {
    std::vector<uint64_t> tokens;
    tokens.reserve(g.size());
    for (const auto& e : g) {
      if (e.cache_id >= cache_slots_.size())
        throw std::runtime_error(who(0) + " (coordinator) ordered unknown cache id " + std::to_string(e.cache_id));
      auto it = pending_.find(cache_slots_[e.cache_id]);
      if (it == pending_.end() && joined_ && cb_.stand_in) {  // joined: the others run it, this rank adds zeros
        tokens.push_back(cb_.stand_in(cache_.at(cache_slots_[e.cache_id]).desc));
        continue;
      }
      if (it == pending_.end() || it->second.round != e.round)
        throw std::runtime_error(who(0) + " (coordinator) ordered a partition this rank does not have pending (cache id " +
                                 std::to_string(e.cache_id) + ", round " + std::to_string(e.round) + ")");
      tokens.push_back(it->second.token);
      pending_.erase(it);
    }
    ++groups_;
    ready_groups_.push_back(std::move(tokens));
  }
}

void Negotiator::apply_error(const ErrorMsg& e) {
  uint64_t token;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(Slot{e.key, e.offset});
    if (it == pending_.end() || it->second.round != e.round) return;  // not ours, or already failed
    token = it->second.token;
    pending_.erase(it);
  }
  cb_.fail(token, Status::Error(e.message, e.code));
}

}  // namespace commsched::collective
