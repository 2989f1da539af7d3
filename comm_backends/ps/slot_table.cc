#include "comm_backends/ps/slot_table.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <tuple>

#include "options/parse.h"
#include "scheduler/stall.h"

namespace commsched::ps {

SlotTable::SlotTable(uint32_t num_workers, bool deterministic, Summer& summer, std::shared_ptr<BufferPool> pool)
    : num_workers_(num_workers),
      deterministic_(deterministic),
      summer_(summer),
      pool_(std::move(pool)),
      joined_(num_workers, false) {}

bool SlotTable::join(uint32_t rank, std::vector<Outcome>& out) {
  if (rank >= num_workers_ || joined_[rank]) return false;
  joined_[rank] = true;
  std::vector<Key> waiting;
  for (auto& [k, s] : slots_)
    if (!s.seen[rank] && !(s.first.flags & kFlagLane)) waiting.push_back(k);
  for (const Key& k : waiting) {
    auto it = slots_.find(k);
    it->second.seen[rank] = true;
    ++it->second.arrived;
    finish_if_complete(it, out);
  }
  return true;
}

bool SlotTable::all_joined() const { return std::count(joined_.begin(), joined_.end(), true) == num_workers_; }

void SlotTable::end_joins() { joined_.assign(num_workers_, false); }

// Workers disagreeing about a tensor (size, dtype, range, broadcast root) is a user error: name everything.
std::string SlotTable::mismatch(const Slot& s, const Header& h) const {
  const Header& f = s.first;
  const bool lane = (f.flags & kFlagLane) != 0;
  if (f.type == h.type && f.dtype == h.dtype && f.length == h.length && f.tensor_bytes == h.tensor_bytes &&
      f.codec == h.codec && f.elements == h.elements && (h.type != MsgType::bcast || f.aux == h.aux) &&
      lane == ((h.flags & kFlagLane) != 0) && (!lane || f.aux == h.aux))
    return {};
  std::ostringstream os;
  os << "key " << h.key << " round " << h.round << ": workers disagree about the tensor: worker " << f.sender_rank
     << " sent " << msg_type_name(f.type) << " of " << f.length << " bytes at offset " << f.offset << " of a "
     << f.tensor_bytes << "-byte " << dtype_name(f.dtype) << " tensor";
  if (f.type == MsgType::bcast) os << " (root " << f.aux << ")";
  if (f.codec) os << " (" << compression::scheme_name(static_cast<compression::Scheme>(f.codec)) << " of " << f.elements << " elements)";
  os << ", worker " << h.sender_rank << " sent " << msg_type_name(h.type) << " of " << h.length << " bytes of a "
     << h.tensor_bytes << "-byte " << dtype_name(h.dtype) << " tensor";
  if (h.type == MsgType::bcast) os << " (root " << h.aux << ")";
  if (h.codec) os << " (" << compression::scheme_name(static_cast<compression::Scheme>(h.codec)) << " of " << h.elements << " elements)";
  if (lane || (h.flags & kFlagLane))
    os << " (hierarchical lanes: the first push " << (lane ? "expects " + std::to_string(f.aux) + " machines" : "is no lane")
       << ", this one " << ((h.flags & kFlagLane) ? "expects " + std::to_string(h.aux) + " machines" : "is no lane") << ")";
  return os.str();
}

std::string SlotTable::malformed(const Header& h, const std::string& why) {
  return "key " + std::to_string(h.key) + " offset " + std::to_string(h.offset) + " round " + std::to_string(h.round) +
         ": worker " + std::to_string(h.sender_rank) + " sent a malformed compressed push: " + why;
}

std::string SlotTable::open(Slot& s, const Header& h) {
  s.first = h;
  s.opened = Clock::now();
  const bool lane = h.type == MsgType::push_pull && (h.flags & kFlagLane);
  if (lane) {
    s.seen.assign(num_workers_, false);
    s.expected = h.aux;
  } else {
    s.seen = joined_;  // joined workers stand in with zeros
    s.arrived = static_cast<uint32_t>(std::count(joined_.begin(), joined_.end(), true));
    s.expected = num_workers_;
  }
  if (deterministic_ && h.type == MsgType::push_pull) s.held.resize(num_workers_);
  if (lane && (h.aux == 0 || h.aux > num_workers_ || num_workers_ % h.aux != 0)) {
    s.expected = 1;  // answered with the error at once
    return "key " + std::to_string(h.key) + " offset " + std::to_string(h.offset) + ": worker " +
           std::to_string(h.sender_rank) + " pushed a hierarchical lane of " + std::to_string(h.aux) +
           " machines, which does not divide the " + std::to_string(num_workers_) + " workers";
  }
  if (h.codec) {
    const auto scheme = static_cast<compression::Scheme>(h.codec);
    if (auto why = compression::wire_spec(scheme, h.dtype, h.elements, h.length, s.spec); !why.empty())
      return malformed(h, why);
  }
  return {};
}

std::string StalledSlot::describe() const {
  return "key " + std::to_string(key) + " offset " + std::to_string(offset) + " round " + std::to_string(round) +
         " waits " + format_seconds(waited_s) + " for " + rank_list(missing, "worker") + " (pushed by " +
         rank_list(pushed, "worker") + ")";
}

std::vector<StalledSlot> SlotTable::stalled(Clock::time_point now, double min_wait_s) const {
  std::vector<StalledSlot> out;
  for (const auto& [k, s] : slots_) {
    const double waited = std::chrono::duration<double>(now - s.opened).count();
    const bool lane = s.first.type == MsgType::push_pull && (s.first.flags & kFlagLane);
    if (lane || !s.error.empty() || s.arrived >= s.expected || waited < min_wait_s) continue;
    StalledSlot t{k.key, k.offset, k.round, waited, {}, {}};
    for (uint32_t r = 0; r < num_workers_; ++r) (s.seen[r] ? t.pushed : t.missing).push_back(static_cast<int>(r));
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const StalledSlot& a, const StalledSlot& b) {
    return a.waited_s != b.waited_s ? a.waited_s > b.waited_s : std::tie(a.key, a.offset) < std::tie(b.key, b.offset);
  });
  return out;
}

void SlotTable::fail_stalled(const StalledSlot& slot, const std::string& message, std::vector<Outcome>& out) {
  auto it = slots_.find(Key{slot.key, slot.offset, slot.round});
  if (it == slots_.end() || !it->second.error.empty()) return;
  Slot& s = it->second;
  s.error = message;  // later pushes of this round get it too (push answers a poisoned slot's pushes at once)
  s.held.clear();
  s.acc.reset();
  s.bcast_data.reset();
  if (!s.waiters.empty()) out.push_back(error_for(s, std::move(s.waiters)));
  s.waiters.clear();
}

void SlotTable::push(const Header& h, PeerId peer, std::unique_ptr<Payload> payload, std::vector<Outcome>& out,
                     uint32_t entry) {
  const Key k{h.key, h.offset, h.round};
  auto [it, fresh] = slots_.try_emplace(k);
  Slot& s = it->second;
  if (fresh) s.error = open(s, h);
  const Waiter w{peer, h.sender_rank, h.request_id, !(h.type == MsgType::bcast && h.aux == h.sender_rank), entry};
  if (h.sender_rank >= num_workers_ || s.seen[h.sender_rank]) {
    Outcome o = error_for(s, {w});
    o.error = "worker " + std::to_string(h.sender_rank) + " sent key " + std::to_string(h.key) + " offset " +
              std::to_string(h.offset) + " round " + std::to_string(h.round) +
              (h.sender_rank < num_workers_ && joined_[h.sender_rank]
                   ? " after joining (join() must be its last call until every worker has joined)"
                   : " twice (or has a bad rank)");
    out.push_back(std::move(o));
    if (fresh) slots_.erase(it);
    return;
  }
  s.seen[h.sender_rank] = true;
  ++s.arrived;
  if (s.error.empty()) s.error = mismatch(s, h);
  if (!s.error.empty()) {
    // Poisoned: answer everybody waiting (and every later push) with the error; drop the data.
    std::vector<Waiter> ws = std::move(s.waiters);
    ws.push_back(w);
    s.waiters.clear();
    s.held.clear();
    s.acc.reset();
    s.bcast_data.reset();
    out.push_back(error_for(s, std::move(ws)));
  } else {
    s.waiters.push_back(w);
    if (h.type == MsgType::bcast) {
      if (h.aux == h.sender_rank) s.bcast_data = std::move(payload);
    } else {
      try {
        accumulate(s, h, std::move(payload));
      } catch (const std::exception& e) {  // a compressed push naming elements outside its range
        s.error = malformed(h, e.what());
      }
    }
  }
  finish_if_complete(it, out);
}

void SlotTable::finish_if_complete(std::unordered_map<Key, Slot, KeyHash>::iterator it, std::vector<Outcome>& out) {
  Slot& s = it->second;
  if (s.arrived < s.expected) return;
  const Header& h = s.first;
  if (!s.error.empty()) {
    if (!s.waiters.empty()) out.push_back(error_for(s, std::move(s.waiters)));  // poisoned by the last push
  } else {
    if (s.first.type == MsgType::bcast && !s.bcast_data) {
      s.error = "key " + std::to_string(h.key) + " round " + std::to_string(h.round) + ": broadcast root worker " +
                std::to_string(h.aux) + " sent no data";
      out.push_back(error_for(s, std::move(s.waiters)));
    } else {
      out.push_back(answer(s, std::move(s.waiters)));
    }
  }
  slots_.erase(it);
}

void SlotTable::accumulate(Slot& s, const Header& h, std::shared_ptr<Payload> p) {
  ++s.summed;
  if (h.codec) return accumulate_encoded(s, h, std::move(p));  // decoded with memcpy: any alignment
  p = element_aligned(std::move(p), dtype_size(h.dtype), *pool_);
  if (deterministic_) {
    s.held[h.sender_rank] = std::move(p);
    return;
  }
  const size_t n = h.length / dtype_size(h.dtype);
  if (s.summed == 1) {
    s.held.assign(1, std::move(p));
  } else if (s.summed == 2) {
    s.acc = pool_->acquire(n * accumulator_size(h.dtype));
    summer_.add2(h.dtype, s.acc.get(), s.held[0]->bytes().data(), p->bytes().data(), n);
    s.held.clear();
  } else {
    summer_.add(h.dtype, s.acc.get(), p->bytes().data(), n);
  }
}

// Streaming: decoded into the accumulator as pushes arrive. Deterministic: held, decoded in rank order at the end.
void SlotTable::accumulate_encoded(Slot& s, const Header& h, std::shared_ptr<Payload> p) {
  if (deterministic_ || num_workers_ == 1) {
    if (num_workers_ == 1) s.held.assign(1, nullptr);
    s.held[num_workers_ == 1 ? 0 : h.sender_rank] = std::move(p);
    return;
  }
  const uint64_t n = h.elements;
  if (!s.acc) {
    const size_t bytes = n * dtype_size(compression::residual_dtype(h.dtype));
    s.acc = pool_->acquire(std::max<size_t>(bytes, 1));
    std::memset(s.acc.get(), 0, bytes);
  }
  compression::decode_add(s.spec, h.dtype, p->bytes().data(), n, s.acc.get());
}

std::shared_ptr<const std::byte> SlotTable::finish_encoded(Slot& s) {
  const Header& f = s.first;
  if (num_workers_ == 1) {  // the push itself is the sum: answer with it, zero-copy
    auto& only = s.held.back();
    return std::shared_ptr<const std::byte>(only, only->bytes().data());
  }
  const DType acc_type = compression::residual_dtype(f.dtype);
  const size_t acc_bytes = f.elements * dtype_size(acc_type);
  if (deterministic_) {
    s.acc = pool_->acquire(std::max<size_t>(acc_bytes, 1));
    std::memset(s.acc.get(), 0, acc_bytes);
    for (uint32_t rank = 0; rank < num_workers_; ++rank) {
      if (!s.held[rank]) continue;  // a joined worker: zeros
      try {
        compression::decode_add(s.spec, f.dtype, s.held[rank]->bytes().data(), f.elements, s.acc.get());
      } catch (const std::exception& e) {
        Header from = f;
        from.sender_rank = rank;
        throw std::runtime_error(malformed(from, e.what()));
      }
    }
  }
  // Error feedback where the codec's row asks for it (top-k: what the answer leaves out is sent in a later round).
  void* residual = nullptr;
  if (compression::codec(s.spec.scheme).server_residual) {
    Range& r = ranges_[Key{f.key, f.offset, 0}];
    if (r.elements != f.elements) r = Range{f.elements, std::vector<std::byte>(acc_bytes, std::byte{0})};
    residual = r.residual.data();
  }
  auto out = pool_->acquire(std::max<size_t>(f.length, 1));
  compression::encode_sum(s.spec, f.dtype, s.acc.get(), f.elements, residual, out.get());
  return out;
}

std::shared_ptr<const std::byte> SlotTable::finish_sum(Slot& s) {
  if (s.first.codec) return finish_encoded(s);
  const DType t = s.first.dtype;
  const size_t n = s.first.length / dtype_size(t);
  if (deterministic_ && num_workers_ > 1) {
    std::vector<const void*> srcs;
    for (auto& p : s.held)
      if (p) srcs.push_back(p->bytes().data());  // null: a joined worker's zeros
    auto out = pool_->acquire(s.first.length);
    summer_.sum_ranked(t, out.get(), srcs, n);
    return out;
  }
  if (s.summed == 1) {  // nothing to add (one worker, or the others joined): answer with the push itself, zero-copy
    auto& only = s.held.back();
    return std::shared_ptr<const std::byte>(only, only->bytes().data());
  }
  if (!needs_narrowing(t)) return s.acc;
  auto out = pool_->acquire(s.first.length);
  summer_.narrow(t, out.get(), s.acc.get(), n);
  return out;
}

Outcome SlotTable::answer(Slot& s, std::vector<Waiter> waiters) {
  Outcome o;
  o.reply = s.first;
  o.reply.type = s.first.type == MsgType::bcast ? MsgType::bcast_data : MsgType::sum;
  o.waiters = std::move(waiters);
  if (s.first.type == MsgType::bcast)
    o.data = std::shared_ptr<const std::byte>(s.bcast_data, s.bcast_data->bytes().data());
  else
    try {
      o.data = finish_sum(s);
    } catch (const std::exception& e) {  // deterministic mode decodes compressed pushes only now
      s.error = e.what();
      return error_for(s, std::move(o.waiters));
    }
  return o;
}

Outcome SlotTable::error_for(const Slot& s, std::vector<Waiter> waiters) const {
  Outcome o;
  o.reply = s.first;
  o.reply.type = MsgType::error;
  o.waiters = std::move(waiters);
  o.error = s.error;
  return o;
}

}  // namespace commsched::ps
