#include "scheduler/global_order.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "options/parse.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/stall.h"

namespace commsched {

std::string task_label(const std::string& name, uint64_t key) {
  std::ostringstream os;
  os << "task '" << name << "' (key 0x" << std::hex << key << ')';
  return os.str();
}

std::string PartitionDesc::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << ' ' << op_name(op) << " bytes [" << offset << ", " << offset + bytes << ") of a "
     << task_bytes << "-byte tensor";
  if (op == Op::broadcast) os << " from root " << root;
  return os.str();
}

void GlobalOrderInbox::adopt(std::unique_ptr<Policy> policy, bool marks) {
  if (!policy) throw InvalidArgument("global order: the policy handed over must not be null");
  {
    std::lock_guard lock(mu_);
    if (closed_)
      throw InvalidArgument("global order: policy '" + std::string(policy->name()) +
                            "' came after the backend's first collective, which its default policy ordered (build the "
                            "engine before using the backend)");
    if (adopted_)
      throw InvalidArgument("global order: a policy was handed over already (one engine per collective backend)");
    adopted_ = true;
    policy_ = std::move(policy);
    marks_ = marks;
  }
  if (posted_) posted_();
}

void GlobalOrderInbox::post(const Knobs& knobs) {
  {
    std::lock_guard lock(mu_);
    knobs_ = knobs;
    fresh_.store(true, std::memory_order_release);
  }
  if (posted_) posted_();
}

GlobalOrderInbox::Adopted GlobalOrderInbox::take_policy(bool last_chance) {
  std::lock_guard lock(mu_);
  if (!adopted_ && last_chance) closed_ = true;
  return {std::move(policy_), marks_};
}

std::optional<Knobs> GlobalOrderInbox::take() {
  if (!fresh_.exchange(false, std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(mu_);
  return knobs_;
}

GlobalOrder::GlobalOrder(int size, std::unique_ptr<Policy> policy, size_t max_cache_entries)
    : size_(size), max_cache_entries_(max_cache_entries), gone_(size, false), joined_(size, false), reported_(size, 0),
      marks_waiting_(size) {
  if (policy) adopt(std::move(policy));
}

void GlobalOrder::adopt(std::unique_ptr<Policy> policy, bool marks) {
  if (!policy) throw InvalidArgument("GlobalOrder: policy must not be null");
  if (policy_) throw std::logic_error("GlobalOrder: a policy orders already");
  policy_ = std::move(policy);
  marks_ = marks;
  policy_->on_global_order();
  driver_.emplace(*policy_);
  if (knobs_) driver_->set_knobs(*std::exchange(knobs_, std::nullopt));
}

void GlobalOrder::set_knobs(Knobs k) {
  if (k.small_tensor_bytes == 0) k.small_tensor_bytes = auto_fusion_bytes_;
  if (driver_) driver_->set_knobs(k);
  else knobs_ = k;
}

void GlobalOrder::take_from(GlobalOrderInbox& inbox) {
  if (!policy_) {
    GlobalOrderInbox::Adopted a = inbox.take_policy(needs_policy());
    if (a.policy) adopt(std::move(a.policy), a.marks);
  }
  if (std::optional<Knobs> k = inbox.take()) set_knobs(*k);
}

void GlobalOrder::on_group_done(Nanos now) {
  if (running_.empty()) return;  // nothing ordered is running (a late completion after an error): nothing to release
  std::shared_ptr<Running> r = std::move(running_.front());
  running_.pop_front();
  if (--r->groups_left == 0) driver_->batch_done(r->batch, now);
}

void GlobalOrder::on_ready(int rank, std::span<const ReadyReport> reports, GlobalOrderOutput& out, Nanos now) {
  reported_[rank] += reports.size();  // what its marks count (IterationMark::after)
  for (const auto& rep : reports) {
    ++stats_.reports;
    if (rep.cache_id == kNoCacheId) {
      record(rank, rep, rep.desc, rep.name, now, out);
      continue;
    }
    ++stats_.cached_reports;
    if (rep.cache_id >= cache_.size()) {
      // A rank cannot know an id we never sent; its partition cannot be matched, so say so rather than hang.
      ErrorMsg e;
      e.code = Status::Code::invalid;
      e.message = "rank " + std::to_string(rank) + " reported unknown cache id " + std::to_string(rep.cache_id);
      out.errors.push_back(std::move(e));
      continue;
    }
    const CachedDesc& c = cache_[rep.cache_id];
    record(rank, rep, c.desc, c.name, now, out);
  }
}

void GlobalOrder::record(int rank, const ReadyReport& rep, const PartitionDesc& desc, const std::string& name,
                         Nanos now, GlobalOrderOutput& out) {
  if (joined_[rank]) {  // it stands in with zeros everywhere: a real submission now cannot be matched
    out.errors.push_back({desc.key, desc.offset, rep.round, Status::Code::invalid,
                          task_label(name, desc.key) + ": rank " + std::to_string(rank) + " submitted " +
                              desc.describe() + " after joining (join() must be its last call until every rank has joined)"});
    return;
  }
  const Slot slot{desc.key, desc.offset};
  if (stall_failed_report(rank, slot, rep.round, out)) return;
  if (rank == 0 ? rep.cache_id != kNoCacheId && vouch(rep, desc, name, now) : vouched_report(rank, slot, rep.round))
    return;
  auto [it, fresh] = pending_.try_emplace(slot);
  Entry& e = it->second;
  if (fresh) {
    start_entry(e, rank, rep, desc, name);
    e.since = now;
    e.reported = joined_;  // joined ranks stand in with zeros
    e.count = static_cast<int>(std::count(joined_.begin(), joined_.end(), true));
    for (int r = 0; r < size_; ++r)
      if (gone_[r] && r != rank) {
        poison(e, rep.round, task_label(name, desc.key) + ": rank " + std::to_string(r) + " has shut down",
               Status::Code::cancelled, out);
        break;
      }
  } else if (e.reported[rank]) {
    poison(e, rep.round,
           task_label(e.name, desc.key) + ": rank " + std::to_string(rank) + " submitted " + desc.describe() +
               " twice (round " + std::to_string(rep.round) + ") before it ran",
           Status::Code::invalid, out);
  } else if (e.desc != desc || e.round != rep.round) {
    poison(e, rep.round, mismatch_message(e, rank, desc, rep.round), Status::Code::invalid, out);
  } else if (!e.poisoned.empty()) {
    // Already failed on the ranks that reported it; fail it on this one too.
    out.errors.push_back({desc.key, desc.offset, rep.round, Status::Code::invalid, e.poisoned});
  }
  if (!e.reported[rank]) {
    e.reported[rank] = true;
    ++e.count;
  }
  if (e.count < size_) return;
  if (e.poisoned.empty()) complete_.push_back(slot);
  else pending_.erase(it);  // every rank has been told
}

void GlobalOrder::start_entry(Entry& e, int rank, const ReadyReport& rep, const PartitionDesc& desc,
                              const std::string& name) {
  e.desc = desc;
  e.name = name;
  e.round = rep.round;
  e.priority = rep.priority;
  e.seq = next_seq_++;
  e.first_rank = rank;
}

bool GlobalOrder::vouch(const ReadyReport& rep, const PartitionDesc& desc, const std::string& name, Nanos now) {
  const Slot slot{desc.key, desc.offset};
  if (!vouch_ || pending_.count(slot) || std::count(gone_.begin(), gone_.end(), true) > 0) return false;
  std::vector<bool> expect(size_, false);
  for (int r = 1; r < size_; ++r) expect[r] = !joined_[r];
  if (std::count(expect.begin(), expect.end(), true) > 0 &&
      !vouched_.try_emplace({slot, rep.round}, Vouched{expect, name, now}).second)
    return false;  // the same round vouched twice: let the ordinary path report the duplicate
  Entry& e = pending_[slot];
  start_entry(e, 0, rep, desc, name);
  e.reported.assign(size_, true);
  e.count = size_;
  complete_.push_back(slot);
  ++stats_.vouched;
  return true;
}

bool GlobalOrder::vouched_report(int rank, const Slot& slot, uint64_t round) {
  auto it = vouched_.find({slot, round});
  if (it == vouched_.end() || !it->second.expect[rank]) return false;
  std::vector<bool>& expect = it->second.expect;
  expect[rank] = false;
  if (std::count(expect.begin(), expect.end(), true) == 0) vouched_.erase(it);
  return true;
}

void GlobalOrder::forget_vouched(int rank) {
  for (auto it = vouched_.begin(); it != vouched_.end();) {
    std::vector<bool>& expect = it->second.expect;
    expect[rank] = false;
    if (std::count(expect.begin(), expect.end(), true) == 0) it = vouched_.erase(it);
    else ++it;
  }
}

bool GlobalOrder::not_yet_ordered(const Slot& slot, uint64_t round) const {
  if (auto it = pending_.find(slot); it != pending_.end() && it->second.round == round) return true;
  for (const auto& [seq, e] : held_)
    if (e.desc.key == slot.key && e.desc.offset == slot.offset && e.round == round) return true;
  return false;
}

void GlobalOrder::fail_vouched(int rank, GlobalOrderOutput& out) {
  for (const auto& [k, v] : vouched_)
    if (v.expect[rank] && !not_yet_ordered(k.slot, k.round))
      out.errors.push_back({k.slot.key, k.slot.offset, k.round, Status::Code::cancelled,
                            task_label(v.name, k.slot.key) + ": rank " + std::to_string(rank) +
                                " shut down before it ran"});
}

std::string GlobalOrder::mismatch_message(const Entry& e, int rank, const PartitionDesc& desc, uint64_t round) const {
  std::ostringstream os;
  os << task_label(e.name, e.desc.key) << " differs across ranks: rank " << e.first_rank << " submitted "
     << e.desc.describe() << " (round " << e.round << "), rank " << rank << " submitted " << desc.describe()
     << " (round " << round << ")";
  return os.str();
}

template <class Reported>
void GlobalOrder::add_stall(std::unordered_map<uint64_t, StalledTask>& by_key, uint64_t key, const std::string& name,
                            Nanos waited, Reported reported) const {
  auto [it, fresh] = by_key.try_emplace(key);
  if (!fresh && it->second.waited >= waited) return;
  StalledTask& t = it->second = StalledTask{name, key, waited, {}, {}};
  for (int r = 0; r < size_; ++r) {
    if (joined_[r] || gone_[r]) continue;  // standing in with zeros, or gone: neither submitted nor missing
    (reported(r) ? t.ready : t.missing).push_back(r);
  }
}

std::vector<StalledTask> GlobalOrder::stalled(Nanos now, Nanos min_wait) const {
  std::unordered_map<uint64_t, StalledTask> by_key;  // a task's partitions wait together: report it once
  for (const auto& [slot, e] : pending_)
    if (e.count < size_ && e.poisoned.empty() && now - e.since >= min_wait)
      add_stall(by_key, slot.key, e.name, now - e.since, [&e](int r) { return bool(e.reported[r]); });
  // Ordered on rank 0's readiness alone (vouching) and still owed by some ranks: the usual stall once a tensor has
  // run before (a rank that skips it in one step).
  for (const auto& [k, v] : vouched_)
    if (now - v.since >= min_wait)
      add_stall(by_key, k.slot.key, v.name, now - v.since, [&v](int r) { return !v.expect[r]; });
  std::vector<StalledTask> out;
  for (auto& [key, t] : by_key)
    if (!t.missing.empty()) out.push_back(std::move(t));
  std::sort(out.begin(), out.end(), [](const StalledTask& a, const StalledTask& b) {
    return a.waited != b.waited ? a.waited > b.waited : a.key < b.key;
  });
  return out;
}

void GlobalOrder::fail_stalled(uint64_t key, const std::string& message, GlobalOrderOutput& out) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    Entry& e = it->second;
    if (it->first.key != key || e.count == size_ || !e.poisoned.empty()) {
      ++it;
      continue;
    }
    poison(e, e.round, message, Status::Code::error, out);
    std::vector<bool> expect(size_);
    for (int r = 0; r < size_; ++r) expect[r] = !e.reported[r] && !gone_[r];
    stall_failed_[{it->first, e.round}] = StallFailed{std::move(expect), message};
    it = pending_.erase(it);  // the ranks that reported it start its next round afresh
  }
  for (auto it = vouched_.begin(); it != vouched_.end();) {
    if (it->first.slot.key != key) {
      ++it;
      continue;
    }
    out.errors.push_back({key, it->first.slot.offset, it->first.round, Status::Code::error, message});
    stall_failed_[it->first] = StallFailed{it->second.expect, message};
    it = vouched_.erase(it);
  }
}

bool GlobalOrder::stall_failed_report(int rank, const Slot& slot, uint64_t round, GlobalOrderOutput& out) {
  auto it = stall_failed_.find({slot, round});
  if (it == stall_failed_.end() || !it->second.expect[rank]) return false;
  out.errors.push_back({slot.key, slot.offset, round, Status::Code::error, it->second.message});
  it->second.expect[rank] = false;
  if (std::count(it->second.expect.begin(), it->second.expect.end(), true) == 0) stall_failed_.erase(it);
  return true;
}

std::string describe_stalls(const std::vector<StalledTask>& stalls, size_t limit) {
  std::ostringstream os;
  for (size_t i = 0; i < stalls.size() && i < limit; ++i) {
    const StalledTask& t = stalls[i];
    os << (i ? "; " : "") << task_label(t.name, t.key) << " waits " << format_seconds(double(t.waited) / 1e9)
       << " for " << rank_list(t.missing) << " (submitted by " << rank_list(t.ready) << ")";
  }
  if (stalls.size() > limit) os << "; and " << stalls.size() - limit << " more";
  return os.str();
}

void GlobalOrder::poison(Entry& e, uint64_t round, std::string message, Status::Code code, GlobalOrderOutput& out) {
  if (e.poisoned.empty()) {
    e.poisoned = message;
    out.errors.push_back({e.desc.key, e.desc.offset, e.round, code, message});
  }
  if (round != e.round) out.errors.push_back({e.desc.key, e.desc.offset, round, code, message});
}

void GlobalOrder::on_bye(int rank, GlobalOrderOutput& out) {
  if (gone_[rank]) return;
  gone_[rank] = true;
  fail_vouched(rank, out);
  forget_vouched(rank);
  for (auto it = pending_.begin(); it != pending_.end();) {
    Entry& e = it->second;
    const bool complete = e.count == size_;
    if (!complete && e.poisoned.empty())
      poison(e, e.round,
             task_label(e.name, e.desc.key) + ": rank " + std::to_string(rank) + " shut down before it ran",
             Status::Code::cancelled, out);
    // Entries complete but not flushed still run; the rest can never complete.
    if (!complete) it = pending_.erase(it);
    else ++it;
  }
}

void GlobalOrder::on_mark(int rank, const IterationMark& mark) {
  if (rank < 0 || rank >= size_ || joined_[rank] || gone_[rank]) return;  // it holds no mark back (tell_marks)
  marks_waiting_[rank].push_back(mark);
}

void GlobalOrder::on_join(int rank, GlobalOrderOutput& out) {
  if (rank < 0 || rank >= size_ || joined_[rank]) return;
  joined_[rank] = true;
  forget_vouched(rank);
  marks_waiting_[rank].clear();  // its iterations ended: the others' marks do not wait for its
  for (auto& [slot, e] : pending_) {
    if (e.reported[rank] || e.count == size_) continue;
    e.reported[rank] = true;
    if (++e.count == size_ && e.poisoned.empty()) complete_.push_back(slot);
  }
  std::erase_if(pending_, [&](const auto& kv) { return kv.second.count == size_ && !kv.second.poisoned.empty(); });
  if (std::count(joined_.begin(), joined_.end(), true) < size_) return;
  joined_.assign(size_, false);
  out.all_joined = rank;
}

uint32_t GlobalOrder::cache_id_for(const Entry& e, OrderMsg& order) {
  const Slot slot{e.desc.key, e.desc.offset};
  auto it = cache_index_.find(slot);
  if (it != cache_index_.end() && cache_[it->second].desc == e.desc) return it->second;
  if (it != cache_index_.end()) {
    // Same slot, new shape (the partition size changed): reuse the id, redefine it for every rank.
    cache_[it->second] = {e.desc, e.name};
    order.defines.push_back({it->second, e.desc});
    return it->second;
  }
  if (cache_.size() >= max_cache_entries_) return kNoCacheId;
  const auto id = static_cast<uint32_t>(cache_.size());
  cache_.push_back({e.desc, e.name});
  cache_index_.emplace(slot, id);
  order.defines.push_back({id, e.desc});
  return id;
}

bool GlobalOrder::fusable(const PartitionDesc& a, const PartitionDesc& b) const {
  return a.op == b.op && a.dtype == b.dtype && (a.op != Op::broadcast || a.root == b.root);
}

void GlobalOrder::tell_arrivals(Nanos now) {
  if (complete_.empty()) return;
  for (const Slot& s : complete_) {
    auto it = pending_.find(s);
    Entry& e = it->second;
    // One arrival per partition: partitions of a task become ready everywhere at different times. The task's size
    // still tells a policy whether the tensor is small.
    const PartRef part{e.seq, 0, e.priority, e.seq, e.desc.offset, e.desc.bytes};
    const uint64_t seq = e.seq;
    const TaskArrival arrival{seq, e.priority, seq, e.desc.task_bytes, std::span<const PartRef>(&part, 1)};
    held_.emplace(seq, std::move(e));
    pending_.erase(it);
    driver_->arrived(arrival, now);
  }
  complete_.clear();
  if (!marks_) driver_->flushed(now);  // see "Iteration marks" in global_order.h
}

void GlobalOrder::tell_marks(Nanos now) {
  for (;;) {
    bool any = false, backward = true;
    for (int r = 0; r < size_; ++r) {
      if (joined_[r] || gone_[r]) continue;
      const auto& waiting = marks_waiting_[r];
      if (waiting.empty() || reported_[r] < waiting.front().after) return;
      any = true;
      backward = backward && waiting.front().backward;
    }
    if (!any) return;
    for (int r = 0; r < size_; ++r)
      if (!marks_waiting_[r].empty()) marks_waiting_[r].pop_front();
    if (backward) driver_->backward_done(now);
    else driver_->flushed(now);
  }
}

size_t GlobalOrder::order_batch(const Batch& batch, GlobalOrderOutput& out) {
  auto& groups = out.order.groups;
  size_t made = 0;
  std::optional<PartitionDesc> group_desc;  // the open group's first partition
  for (const PartRef& p : batch) {
    auto it = held_.find(p.task_id);
    if (it == held_.end())
      throw std::logic_error("global order: policy '" + std::string(policy_->name()) + "' dispatched unknown partition " +
                             std::to_string(p.task_id));
    Entry e = std::move(it->second);
    held_.erase(it);
    const uint32_t id = cache_id_for(e, out.order);
    if (id == kNoCacheId) {
      // Orders name partitions by cache id; past the cap a partition cannot be named, so fail it loudly.
      out.errors.push_back({e.desc.key, e.desc.offset, e.round, Status::Code::error,
                            task_label(e.name, e.desc.key) + ": more than " + std::to_string(max_cache_entries_) +
                                " distinct partitions in the negotiation cache"});
      continue;
    }
    if (!group_desc || !fusable(*group_desc, e.desc)) {
      groups.emplace_back();
      group_desc = e.desc;
      ++made;
      ++stats_.groups;
    }
    groups.back().push_back({id, e.round});
    ++stats_.ordered;
  }
  return made;
}

bool GlobalOrder::dispatch(Batch& batch, Nanos /*now*/) {
  const size_t groups = order_batch(batch, *out_);
  if (groups == 0) return false;  // it ordered nothing: done at once, which may free credit for more
  auto running = std::make_shared<Running>();
  running->groups_left = groups;
  running->batch = std::move(batch);
  for (size_t g = 0; g < groups; ++g) running_.push_back(running);
  ordered_ = true;
  return true;
}

void GlobalOrder::flush(Nanos now, GlobalOrderOutput& out) {
  if (needs_policy()) adopt(std::make_unique<PriorityCreditPolicy>(0));
  if (!policy_) return;  // nothing is ready everywhere yet
  tell_arrivals(now);
  if (marks_) tell_marks(now);
  out_ = &out;
  ordered_ = false;
  driver_->pump(now, *this);  // its wake-up is next_wakeup()'s, which knows when the order is held back
  out_ = nullptr;
  if (ordered_) ++stats_.flushes;
}

}  // namespace commsched
