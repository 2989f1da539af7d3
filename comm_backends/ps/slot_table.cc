#include "comm_backends/ps/slot_table.h"

#include <cstring>
#include <sstream>

namespace commsched::ps {

SlotTable::SlotTable(uint32_t num_workers, bool deterministic, Summer& summer, std::shared_ptr<BufferPool> pool)
    : num_workers_(num_workers), deterministic_(deterministic), summer_(summer), pool_(std::move(pool)) {}

// Workers disagreeing about a tensor (size, dtype, range, broadcast root) is a user error: name everything.
std::string SlotTable::mismatch(const Slot& s, const Header& h) const {
  const Header& f = s.first;
  if (f.type == h.type && f.dtype == h.dtype && f.length == h.length && f.tensor_bytes == h.tensor_bytes &&
      (h.type != MsgType::bcast || f.aux == h.aux))
    return {};
  std::ostringstream os;
  os << "key " << h.key << " round " << h.round << ": workers disagree about the tensor: worker " << f.sender_rank
     << " sent " << msg_type_name(f.type) << " of " << f.length << " bytes at offset " << f.offset << " of a "
     << f.tensor_bytes << "-byte " << dtype_name(f.dtype) << " tensor";
  if (f.type == MsgType::bcast) os << " (root " << f.aux << ")";
  os << ", worker " << h.sender_rank << " sent " << msg_type_name(h.type) << " of " << h.length << " bytes of a "
     << h.tensor_bytes << "-byte " << dtype_name(h.dtype) << " tensor";
  if (h.type == MsgType::bcast) os << " (root " << h.aux << ")";
  return os.str();
}

void SlotTable::push(const Header& h, PeerId peer, std::unique_ptr<Payload> payload, std::vector<Outcome>& out) {
  const Key k{h.key, h.offset, h.round};
  auto [it, fresh] = slots_.try_emplace(k);
  Slot& s = it->second;
  if (fresh) {
    s.first = h;
    s.seen.assign(num_workers_, false);
    if (deterministic_ && h.type == MsgType::push_pull) s.held.resize(num_workers_);
  }
  const Waiter w{peer, h.sender_rank, h.request_id, !(h.type == MsgType::bcast && h.aux == h.sender_rank)};
  if (h.sender_rank >= num_workers_ || s.seen[h.sender_rank]) {
    Outcome o = error_for(s, {w});
    o.error = "worker " + std::to_string(h.sender_rank) + " sent key " + std::to_string(h.key) + " offset " +
              std::to_string(h.offset) + " round " + std::to_string(h.round) + " twice (or has a bad rank)";
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
      accumulate(s, h, std::move(payload));
    }
  }
  if (s.arrived < num_workers_) return;
  if (s.error.empty()) {
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
  if (deterministic_) {
    s.held[h.sender_rank] = std::move(p);
    return;
  }
  const size_t n = h.length / dtype_size(h.dtype);
  if (s.arrived == 1) {
    s.held.assign(1, std::move(p));
  } else if (s.arrived == 2) {
    s.acc = pool_->acquire(n * accumulator_size(h.dtype));
    summer_.add2(h.dtype, s.acc.get(), s.held[0]->bytes().data(), p->bytes().data(), n);
    s.held.clear();
  } else {
    summer_.add(h.dtype, s.acc.get(), p->bytes().data(), n);
  }
}

std::shared_ptr<const std::byte> SlotTable::finish_sum(Slot& s) {
  const DType t = s.first.dtype;
  const size_t n = s.first.length / dtype_size(t);
  if (deterministic_ && num_workers_ > 1) {
    std::vector<const void*> srcs;
    for (auto& p : s.held) srcs.push_back(p->bytes().data());
    auto out = pool_->acquire(s.first.length);
    summer_.sum_ranked(t, out.get(), srcs, n);
    return out;
  }
  if (num_workers_ == 1) {  // nothing to add: answer with the push itself, zero-copy
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
    o.data = finish_sum(s);
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
