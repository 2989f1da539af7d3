// The server's state for asynchronous and stale-synchronous gradients (COMMSCHED_PS_MODE=async|ssp): push_pulls that
// carry kFlagAsync. Transport-free, as SlotTable (which still serves every other push_pull and every broadcast).
//
// Semantics: the server keeps no weights. Per tensor (key) it keeps, for each worker, the sum of every push (of every
// worker, its own included) since that worker's last answer for the same range: a push adds its range to each
// worker's pending sum, and its answer is that range of the pusher's pending sum, which then starts again from zero
// there. So every gradient reaches every worker exactly once, as a term of one answer: only additions, never a
// subtraction from a running total, so integer sums are exact and float sums have the rounding of ordinary sums.
// Pending sums cover the whole tensor, so partition boundaries may change between rounds (live tuning). The worker
// applies the answer as it would a synchronous sum (DistributedOptimizer averages it over the workers); with plain
// SGD every worker ends with the same weights once every answer is in.
//
// Async: answered at once. SSP: the answer waits, and is taken when released, for the StalenessGate's bound.
// f16/bf16 accumulate in f32 and are rounded once per answer. Refused (an error answer naming why): compressed
// pushes (top-k, signSGD: their server step, the residual and the majority vote, is defined over one round of every
// worker) and hierarchical lanes (their slot sums one machine's slice per round). Cost: per tensor, one pending sum
// per worker (memory: workers x the tensor, f32 for f16/bf16), and each push is added once per worker.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm_backends/ps/buffer_pool.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/slot_table.h"
#include "comm_backends/ps/staleness_gate.h"
#include "comm_backends/ps/sum_kernels.h"
#include "comm_backends/ps/transport.h"

namespace commsched::ps {

class AsyncTable {
 public:
  // staleness: k (ssp); nullopt: no bound (async).
  AsyncTable(uint32_t num_workers, std::optional<uint64_t> staleness, Summer& summer, std::shared_ptr<BufferPool> pool);
  // One kFlagAsync push_pull. Appends the answers that became due (this one and held ones) to `out`.
  void push(const Header& h, PeerId peer, std::unique_ptr<Payload> payload, std::vector<Outcome>& out);
  // Worker `rank` has joined: it holds nobody back any more. Appends answers released by that.
  void join(uint32_t rank, std::vector<Outcome>& out);
  // Every worker has joined: rounds start from 0 again (pending sums are kept: they are still owed).
  void end_joins();
  size_t held() const;
  size_t tensors() const { return tensors_.size(); }

 private:
  struct Tensor {
    Tensor(uint32_t workers, std::optional<uint64_t> bound) : gate(workers, bound), pending(workers) {}
    Header first;  // the dtype and size every later push must match
    StalenessGate gate;
    std::vector<std::shared_ptr<std::byte>> pending;  // by rank: the whole tensor in the accumulator type
    std::unordered_map<uint64_t, std::pair<Header, Waiter>> asked;  // by ticket id: pushes whose answer is held
  };

  std::string refusal(const Tensor* t, const Header& h) const;
  Tensor& open(const Header& h);
  void add(Tensor& t, const Header& h, const Payload& p);
  void answer(Tensor& t, const std::vector<StalenessGate::Ticket>& released, std::vector<Outcome>& out);
  std::shared_ptr<const std::byte> take(Tensor& t, const Header& h);

  uint32_t num_workers_;
  std::optional<uint64_t> staleness_;
  Summer& summer_;
  std::shared_ptr<BufferPool> pool_;
  std::unordered_map<uint64_t, Tensor> tensors_;  // by key
  std::vector<bool> joined_;  // by rank: tensors opened later start with them aside
  uint64_t next_ticket_ = 1;
};

}  // namespace commsched::ps
