// The order's path through a rank's negotiator: submissions reported to rank 0 (from the submitting thread, or as one
// burst from the negotiator thread), iteration marks counted behind them, rank 0's ordering round (the policy handed
// over, its knobs, completions, the order published to every rank), and orders and errors applied here. Connections
// are negotiator.cc's, the rounds (the loop, or a helping caller) negotiator_rounds.cc's; a peer's loss, keep-alive
// and shutdown negotiator_faults.cc's.
#include "comm_backends/collective/negotiator.h"

#include <sstream>
#include <stdexcept>
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
      to_thread = !ordered_ahead_.empty();  // a group rank 0 ordered ahead may be complete now: run it there
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
      coordinator_->on_ready(0, reports, out, now_ns());
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
  vouched_.store(coordinator_->stats().vouched, std::memory_order_relaxed);
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
    const bool ordered = fill_awaited_locked(s);  // rank 0 vouched for it: its group may run now
    if (!ordered) pending_.emplace(slot, Local{s.token, s.round, s.desc, s.name});
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
    OrderedAhead group;
    group.tokens.resize(g.size());
    group.have.assign(g.size(), false);
    std::vector<size_t> waiting;
    for (size_t i = 0; i < g.size(); ++i) {
      if (const auto token = ordered_token_locked(g[i])) {
        group.tokens[i] = *token;
        group.have[i] = true;
      } else {
        waiting.push_back(i);
      }
    }
    ++groups_;
    group.missing = waiting.size();
    if (group.missing == 0 && ordered_ahead_.empty()) {
      ready_groups_.push_back(std::move(group.tokens));
      continue;
    }
    OrderedAhead& placed = ordered_ahead_.emplace_back(std::move(group));
    for (size_t i : waiting) {
      const Slot slot = cache_slots_[g[i].cache_id];
      awaited_.emplace(slot, Awaited{g[i].round, cache_.at(slot).desc, &placed, i});
    }
  }
  promote_ahead_locked();
}

std::optional<uint64_t> Negotiator::ordered_token_locked(const OrderEntry& e) {
  if (e.cache_id >= cache_slots_.size())
    throw std::runtime_error(who(0) + " (coordinator) ordered unknown cache id " + std::to_string(e.cache_id));
  const Slot slot = cache_slots_[e.cache_id];
  const PartitionDesc& ordered = cache_.at(slot).desc;
  auto it = pending_.find(slot);
  if (it != pending_.end() && it->second.round == e.round) {
    // Rank 0 may have vouched before this rank's report reached it (GlobalOrder "Vouching"): check what it ordered.
    if (it->second.desc != ordered) {  // the group fails at the end of this round (throw_if_vouch_error)
      if (vouch_error_.empty())
        vouch_error_ = vouch_mismatch(it->second.name, ordered, e.round, it->second.desc, it->second.round);
      return std::nullopt;
    }
    const uint64_t token = it->second.token;
    pending_.erase(it);
    return token;
  }
  if (it == pending_.end() && joined_ && cb_.stand_in) return cb_.stand_in(ordered);  // the others run it: zeros here
  if (it == pending_.end() && opts_.vouch && !awaited_.count(slot)) return std::nullopt;  // it runs once submitted
  throw std::runtime_error(who(0) + " (coordinator) ordered a partition this rank does not have pending (cache id " +
                           std::to_string(e.cache_id) + ", round " + std::to_string(e.round) + ")");
}

bool Negotiator::fill_awaited_locked(const Submission& s) {
  auto it = awaited_.find(Slot{s.desc.key, s.desc.offset});
  if (it == awaited_.end()) return false;
  const Awaited& a = it->second;
  if (a.round != s.round || a.desc != s.desc) {
    if (vouch_error_.empty()) vouch_error_ = vouch_mismatch(s.name, a.desc, a.round, s.desc, s.round);
    return false;  // pending like any other, so the group's failure fails it
  }
  a.group->tokens[a.index] = s.token;
  a.group->have[a.index] = true;
  --a.group->missing;
  awaited_.erase(it);
  return true;
}

void Negotiator::promote_ahead_locked() {
  while (!ordered_ahead_.empty() && ordered_ahead_.front().missing == 0) {
    ready_groups_.push_back(std::move(ordered_ahead_.front().tokens));
    ordered_ahead_.pop_front();
  }
}

void Negotiator::throw_if_vouch_error() {
  std::string error;
  {
    std::lock_guard lock(mu_);
    error = vouch_error_;
  }
  // Not a malformed message from rank 0 (which would fail the group naming it): this rank's submission differs.
  if (!error.empty()) throw std::runtime_error(error);
}

void Negotiator::stand_in_awaited_locked() {
  if (!cb_.stand_in) return;
  for (auto& [slot, a] : awaited_) {
    a.group->tokens[a.index] = cb_.stand_in(a.desc);
    a.group->have[a.index] = true;
    --a.group->missing;
  }
  awaited_.clear();
}

std::string Negotiator::vouch_mismatch(const std::string& name, const PartitionDesc& ordered, uint64_t ordered_round,
                                       const PartitionDesc& mine, uint64_t my_round) const {
  std::ostringstream os;
  os << task_label(name, mine.key) << " differs across ranks: rank 0 ordered " << ordered.describe() << " (round "
     << ordered_round << "), as every rank had it before, and rank " << opts_.rank << " submitted " << mine.describe()
     << " (round " << my_round << ")";
  return os.str();
}

void Negotiator::apply_error(const ErrorMsg& e) {
  uint64_t token;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(Slot{e.key, e.offset});
    if (it == pending_.end()) {  // ordered already (rank 0 vouched), failed already, or not ours
      // Only a shut-down rank's reason is kept for the collective that will fail without it; another error of a
      // partition no longer pending must not relabel a later failure.
      if (e.code == Status::Code::cancelled) {
        ordered_failures_[Slot{e.key, e.offset}] = {e.round, e.message};
        reasons_changed_locked();
      }
      return;
    }
    if (it->second.round != e.round) return;
    token = it->second.token;
    pending_.erase(it);
  }
  cb_.fail(token, Status::Error(e.message, e.code));
}

std::string Negotiator::ordered_failure(uint64_t key, uint64_t offset, uint64_t round) {
  std::lock_guard lock(mu_);
  auto it = ordered_failures_.find(Slot{key, offset});
  if (it == ordered_failures_.end() || it->second.first != round) return {};
  std::string why = std::move(it->second.second);
  ordered_failures_.erase(it);
  reasons_changed_locked();
  return why;
}

void Negotiator::ran(std::span<const PartitionView> group) {
  if (!any_ordered_failures_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  for (const PartitionView& v : group) {
    auto it = ordered_failures_.find(Slot{v.task->key, v.offset});
    if (it != ordered_failures_.end() && it->second.first <= v.task->round) ordered_failures_.erase(it);
  }
  reasons_changed_locked();
}

void Negotiator::reasons_changed_locked() {
  any_ordered_failures_.store(!ordered_failures_.empty(), std::memory_order_release);
}

}  // namespace commsched::collective
