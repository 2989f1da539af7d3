#include "comm_backends/collective/coordinator.h"

#include <algorithm>
#include <sstream>

namespace commsched::collective {
namespace {

std::string task_label(const std::string& name, uint64_t key) {
  std::ostringstream os;
  os << "task '" << name << "' (key 0x" << std::hex << key << ')';
  return os.str();
}

}  // namespace

Coordinator::Coordinator(int size, uint64_t fusion_bytes, uint64_t credit_bytes, size_t max_cache_entries)
    : size_(size),
      fusion_bytes_(fusion_bytes),
      credit_bytes_(credit_bytes),
      max_cache_entries_(max_cache_entries),
      gone_(size, false) {}

void Coordinator::on_completed(uint64_t bytes) { inflight_bytes_ -= std::min(bytes, inflight_bytes_); }

bool Coordinator::credit_allows(uint64_t bytes) const {
  // Never starve: with nothing in flight, even a partition larger than the credit goes.
  return credit_bytes_ == 0 || inflight_bytes_ == 0 || inflight_bytes_ + bytes <= credit_bytes_;
}

void Coordinator::on_ready(int rank, std::span<const ReadyReport> reports, CoordinatorOutput& out) {
  for (const auto& rep : reports) {
    ++stats_.reports;
    if (rep.cache_id == kNoCacheId) {
      record(rank, rep, rep.desc, rep.name, out);
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
    record(rank, rep, c.desc, c.name, out);
  }
}

void Coordinator::record(int rank, const ReadyReport& rep, const PartitionDesc& desc, const std::string& name,
                         CoordinatorOutput& out) {
  const Slot slot{desc.key, desc.offset};
  auto [it, fresh] = pending_.try_emplace(slot);
  Entry& e = it->second;
  if (fresh) {
    e.desc = desc;
    e.name = name;
    e.round = rep.round;
    e.priority = rep.priority;
    e.seq = next_seq_++;
    e.first_rank = rank;
    e.reported.assign(size_, false);
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

std::string Coordinator::mismatch_message(const Entry& e, int rank, const PartitionDesc& desc, uint64_t round) const {
  std::ostringstream os;
  os << task_label(e.name, e.desc.key) << " differs across ranks: rank " << e.first_rank << " submitted "
     << e.desc.describe() << " (round " << e.round << "), rank " << rank << " submitted " << desc.describe()
     << " (round " << round << ")";
  return os.str();
}

void Coordinator::poison(Entry& e, uint64_t round, std::string message, Status::Code code, CoordinatorOutput& out) {
  if (e.poisoned.empty()) {
    e.poisoned = message;
    out.errors.push_back({e.desc.key, e.desc.offset, e.round, code, message});
  }
  if (round != e.round) out.errors.push_back({e.desc.key, e.desc.offset, round, code, message});
}

void Coordinator::on_bye(int rank, CoordinatorOutput& out) {
  if (gone_[rank]) return;
  gone_[rank] = true;
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

uint32_t Coordinator::cache_id_for(const Entry& e, OrderMsg& order) {
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

bool Coordinator::fusable(const PartitionDesc& a, const PartitionDesc& b) const {
  return a.op == b.op && a.dtype == b.dtype && (a.op != Op::broadcast || a.root == b.root);
}

void Coordinator::flush(CoordinatorOutput& out) {
  for (const Slot& s : complete_) {
    auto it = pending_.find(s);
    Entry& e = it->second;
    ready_.emplace(std::make_pair(e.priority, e.seq), std::move(e));
    pending_.erase(it);
  }
  complete_.clear();
  if (ready_.empty() || !credit_allows(ready_.begin()->second.desc.bytes)) return;
  std::vector<Entry> ready;
  while (!ready_.empty() && credit_allows(ready_.begin()->second.desc.bytes)) {
    if (credit_bytes_ > 0) inflight_bytes_ += ready_.begin()->second.desc.bytes;
    ready.push_back(std::move(ready_.begin()->second));
    ready_.erase(ready_.begin());
  }

  auto& groups = out.order.groups;
  uint64_t group_bytes = 0;
  const PartitionDesc* group_desc = nullptr;
  for (const Entry& e : ready) {
    const uint32_t id = cache_id_for(e, out.order);
    if (id == kNoCacheId) {
      // Orders name partitions by cache id; past the cap a partition cannot be named, so fail it loudly.
      out.errors.push_back({e.desc.key, e.desc.offset, e.round, Status::Code::error,
                            task_label(e.name, e.desc.key) + ": more than " + std::to_string(max_cache_entries_) +
                                " distinct partitions in the negotiation cache"});
      continue;
    }
    const bool small = fusion_bytes_ > 0 && e.desc.bytes < fusion_bytes_;
    const bool joins = small && group_desc && fusable(*group_desc, e.desc) && group_bytes + e.desc.bytes <= fusion_bytes_;
    if (!joins) {
      groups.emplace_back();
      group_bytes = 0;
      group_desc = small ? &e.desc : nullptr;
      ++stats_.groups;
    }
    groups.back().push_back({id, e.round});
    group_bytes += e.desc.bytes;
    ++stats_.ordered;
  }
  ++stats_.flushes;
}

}  // namespace commsched::collective
