#include "comm_backends/ps/async_table.h"

#include <algorithm>
#include <cstring>

namespace commsched::ps {
namespace {
// The largest running sum of one tensor for one worker (accumulator bytes).
constexpr uint64_t kMaxPendingBytes = 1ull << 40;
}  // namespace

AsyncTable::AsyncTable(uint32_t num_workers, std::optional<uint64_t> staleness, Summer& summer,
                       std::shared_ptr<BufferPool> pool)
    : num_workers_(num_workers),
      staleness_(staleness),
      summer_(summer),
      pool_(std::move(pool)),
      joined_(num_workers, false) {}

size_t AsyncTable::held() const {
  size_t n = 0;
  for (const auto& [k, t] : tensors_) n += t.gate.held();
  return n;
}

// Why this push cannot be taken ("" when it can). `t`: the tensor's state when it has one.
std::string AsyncTable::refusal(const Tensor* t, const Header& h) const {
  const std::string where = "key " + std::to_string(h.key) + " offset " + std::to_string(h.offset) + ": worker " +
                            std::to_string(h.sender_rank);
  if (h.codec)
    return where + " pushed a " + std::string(compression::scheme_name(static_cast<compression::Scheme>(h.codec))) +
           "-compressed gradient, which asynchronous training cannot sum (the server's top-k residual and signSGD's "
           "majority vote are defined over one round of every worker); use fp16, bf16 or no compression, or "
           "COMMSCHED_PS_MODE=sync";
  if (h.flags & kFlagLane) return where + " pushed a hierarchical lane, which needs COMMSCHED_PS_MODE=sync";
  const uint64_t es = dtype_size(h.dtype);
  if (h.length % es || h.offset % es || h.tensor_bytes % es || h.offset + h.length > h.tensor_bytes)
    return where + " pushed " + std::to_string(h.length) + " bytes at offset " + std::to_string(h.offset) + " of a " +
           std::to_string(h.tensor_bytes) + "-byte " + std::string(dtype_name(h.dtype)) +
           " tensor: not whole elements within the tensor";
  // open() gives every worker a running sum of the whole tensor in wide accumulators: a size beyond what that can
  // hold is refused here, before the byte count wraps (a header of 2^63 f16 bytes made it 0: a heap overflow) or the
  // allocation fails on the server's I/O thread.
  if (h.tensor_bytes / es > kMaxPendingBytes / accumulator_size(h.dtype))
    return where + " pushed a gradient of a " + std::to_string(h.tensor_bytes) + "-byte " +
           std::string(dtype_name(h.dtype)) + " tensor: asynchronous training keeps a running sum of the whole " +
           "tensor for each worker and holds at most " + std::to_string(kMaxPendingBytes >> 30) + " GiB per sum";
  if (!t) return {};
  const Header& f = t->first;
  if (f.dtype == h.dtype && f.tensor_bytes == h.tensor_bytes) return {};
  return where + " pushed a " + std::to_string(h.tensor_bytes) + "-byte " + std::string(dtype_name(h.dtype)) +
         " tensor, but worker " + std::to_string(f.sender_rank) + " pushed a " + std::to_string(f.tensor_bytes) +
         "-byte " + std::string(dtype_name(f.dtype)) + " tensor: workers disagree about the tensor";
}

// A tensor's first push: every worker's pending sum starts at zero; joined workers hold nobody back.
AsyncTable::Tensor& AsyncTable::open(const Header& h) {
  Tensor& t = tensors_.try_emplace(h.key, num_workers_, staleness_).first->second;
  t.first = h;
  const size_t bytes = h.tensor_bytes / dtype_size(h.dtype) * accumulator_size(h.dtype);
  for (auto& acc : t.pending) {
    acc = pool_->acquire(std::max<size_t>(bytes, 1));
    std::memset(acc.get(), 0, bytes);
  }
  std::vector<StalenessGate::Ticket> none;
  for (uint32_t w = 0; w < num_workers_; ++w)
    if (joined_[w]) t.gate.stand_aside(w, none);
  return t;
}

void AsyncTable::push(const Header& h, PeerId peer, std::unique_ptr<Payload> payload, std::vector<Outcome>& out) {
  auto it = tensors_.find(h.key);
  std::string why = refusal(it == tensors_.end() ? nullptr : &it->second, h);
  Tensor* t = nullptr;
  std::vector<StalenessGate::Ticket> released;
  const StalenessGate::Ticket ticket{h.sender_rank, h.round, next_ticket_++};
  if (why.empty()) {
    t = it == tensors_.end() ? &open(h) : &it->second;
    why = t->gate.pushed(ticket, released);
  }
  if (!why.empty()) {
    Outcome o;
    o.reply = h;
    o.reply.type = MsgType::error;
    o.waiters.push_back(Waiter{peer, h.sender_rank, h.request_id, true});
    o.error = std::move(why);
    out.push_back(std::move(o));
    return;
  }
  add(*t, h, *element_aligned(std::shared_ptr<Payload>(std::move(payload)), dtype_size(h.dtype), *pool_));
  t->asked.emplace(ticket.id, std::make_pair(h, Waiter{peer, h.sender_rank, h.request_id, true}));
  answer(*t, released, out);
}

// Every worker's pending sum gains this push's range.
void AsyncTable::add(Tensor& t, const Header& h, const Payload& p) {
  const size_t n = h.length / dtype_size(h.dtype);
  const size_t at = h.offset / dtype_size(h.dtype) * accumulator_size(h.dtype);
  for (auto& acc : t.pending) summer_.add(h.dtype, acc.get() + at, p.bytes().data(), n);
}

// The range of `h` of its sender's pending sum, in the tensor's dtype; there the sender starts again from zero.
std::shared_ptr<const std::byte> AsyncTable::take(Tensor& t, const Header& h) {
  const size_t n = h.length / dtype_size(h.dtype);
  const size_t acc_bytes = n * accumulator_size(h.dtype);
  std::byte* acc = t.pending[h.sender_rank].get() + h.offset / dtype_size(h.dtype) * accumulator_size(h.dtype);
  auto out = pool_->acquire(std::max<size_t>(h.length, 1));
  if (needs_narrowing(h.dtype)) summer_.narrow(h.dtype, out.get(), acc, n);
  else std::memcpy(out.get(), acc, h.length);
  std::memset(acc, 0, acc_bytes);
  return out;
}

void AsyncTable::answer(Tensor& t, const std::vector<StalenessGate::Ticket>& released, std::vector<Outcome>& out) {
  for (const StalenessGate::Ticket& ticket : released) {
    auto asked = t.asked.find(ticket.id);
    if (asked == t.asked.end()) continue;
    Outcome o;
    o.reply = asked->second.first;
    o.reply.type = MsgType::sum;
    o.waiters.push_back(asked->second.second);
    o.data = take(t, asked->second.first);
    t.asked.erase(asked);
    out.push_back(std::move(o));
  }
}

void AsyncTable::join(uint32_t rank, std::vector<Outcome>& out) {
  if (rank >= num_workers_ || joined_[rank]) return;
  joined_[rank] = true;
  for (auto& [k, t] : tensors_) {
    std::vector<StalenessGate::Ticket> released;
    t.gate.stand_aside(rank, released);
    answer(t, released, out);
  }
}

void AsyncTable::end_joins() {
  joined_.assign(num_workers_, false);
  for (auto& [k, t] : tensors_) t.gate.reset();
}

}  // namespace commsched::ps
