// Base class of every collective backend (Gloo, NCCL): owns the order negotiation and an executor thread, so a
// concrete backend only moves bytes.
//
//   engine ──start(batch)──► negotiator (agree on the order with every rank) ──► executor thread ──► execute(group)
//
// execute() is called with groups in the same order on every rank, one at a time. A group of more than one partition
// shares op, dtype (and root for broadcast) and is meant to be fused into one collective.
//
// Where execute() runs: on the executor thread, or, for a backend whose execute() is synchronous (Gloo), on the
// negotiator thread that received (on rank 0: made) the order (execute_on_negotiator_thread): one thread wake-up
// fewer per collective, which on a busy machine is worth up to a scheduler slice; orders that arrive meanwhile wait in
// the socket and are read without sleeping. Rank 0's coordinator then answers reports that arrive during a collective
// when it ends. That could leave the other ranks a message late for back-to-back collectives, but measured with
// fusion off (collective_bench, COMMSCHED_COLLECTIVE_FUSION_BYTES=none, 16 x 64 KiB) it costs fewer wake-ups than the
// executor thread did, not more.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm_backends/collective/negotiator.h"
#include "comm_backends/comm_backend.h"
#include "options/option_table.h"
#include "scheduler/config.h"

namespace commsched {
struct ClusterEnv;
}

namespace commsched::collective {

// Settings every collective backend shares. Rank 0 runs the engine's own policy over the partitions ready on every
// rank (handed over through BackendCapabilities::global_order; see scheduler/global_order.h); `policy` is the engines'
// configuration (COMMSCHED_POLICY and its options), read for the knobs rank 0 starts with. Environment:
// COMMSCHED_COLLECTIVE_FUSION_BYTES (default 1MiB; "none" = no fusion): bytescheduler's small-tensor fusion bound on a
// collective when COMMSCHED_SMALL_TENSOR_BYTES sets none; COMMSCHED_COLLECTIVE_CREDIT_BYTES (default unlimited): the
// global credit until the backend's driver posts its credit knob (an engine does at once; a per-rank credit in each
// engine can deadlock a collective).
struct CollectiveOptions {
  uint64_t fusion_bytes = 1u << 20;
  uint64_t credit_bytes = 0;
  double spin_s = NegotiatorOptions{}.spin_s;  // COMMSCHED_COLLECTIVE_SPIN: see NegotiatorOptions::spin_s
  bool vouch = NegotiatorOptions{}.vouch;       // COMMSCHED_COLLECTIVE_VOUCH: see NegotiatorOptions::vouch
  StallOptions stall;                            // COMMSCHED_STALL_*: see NegotiatorOptions::stall
  EngineConfig policy;
  static CollectiveOptions from_env();
  static const OptionTable<CollectiveOptions>& table();  // the option registry's rows
  // Negotiator options for this process from the cluster contract (timeout, coordinator address).
  NegotiatorOptions negotiator_options(const ClusterEnv& env) const;
};

class CollectiveBackend : public CommBackend {
 public:
  ~CollectiveBackend() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void shutdown() override;
  // global_order: the order, and so the credit, is decided in the order negotiation (one global credit on rank 0,
  // scheduler/global_order.h), not in each rank's engine: an engine hands its own policy to the negotiator's
  // order_inbox and posts its knobs there (COMMSCHED_CREDIT_BYTES, the fusion bound, the auto-tuner's choices), which
  // reach that policy's set_knobs whole on rank 0; COMMSCHED_COLLECTIVE_CREDIT_BYTES is the credit until then. Without
  // an engine (a backend driven directly) rank 0 orders with bytescheduler (GlobalOrder::flush). joins (Horovod's) where this
  // backend's buffers are host memory (Gloo): a joined rank runs the others' partitions with zeros of the ordered
  // size until every rank has joined (see Negotiator::join). stragglers: who lags, as rank 0's negotiator sees the
  // ranks report ready (Negotiator::stragglers).
  BackendCapabilities capabilities() const override;
  NegotiatorStats negotiation_stats() const;

 protected:
  using GroupDone = std::function<void(const Status&)>;

  CollectiveBackend(int rank, int size);
  // Call once from the derived constructor, after the data plane is connected. `execute_on_negotiator_thread`: see above.
  void start_negotiation(NegotiatorOptions opts, control::Store& store, bool execute_on_negotiator_thread = false);
  // Moves one group (one partition, or several to fuse). Call `done` exactly once, inline or later from any thread.
  // An exception counts as done(error).
  virtual void execute(std::span<const PartitionView> group, GroupDone done) = 0;
  // The group is broken (a rank died): abort whatever the data plane has in flight. Called from the negotiator thread.
  virtual void on_fatal(const Status& /*status*/) {}
  // After the executor stopped: wait for asynchronous completions still outstanding (NCCL events).
  virtual void drain() {}
  // Derived destructors call this first, so no callback reaches a half-destroyed object.
  void stop_base();

 private:
  void do_start(std::vector<PartitionView> batch, BatchDone sent, BatchDone done) override;  // never calls `sent`

  struct BatchState {
    BatchDone done;
    size_t remaining = 0;
    Status status;
  };
  struct Item {
    PartitionView view;
    std::shared_ptr<BatchState> batch;
  };

  // A zero-filled stand-in for a partition only the other ranks have (after join): owned by its item's batch.
  uint64_t stand_in(const PartitionDesc& desc);
  // Returns a non-empty message when the partition cannot be carried by this backend.
  std::string check(const PartitionView& p) const;
  Submission submission(uint64_t token, const PartitionView& p) const;
  void complete(uint64_t token, const Status& st);
  void enqueue(std::vector<uint64_t>&& group);
  void fatal(const Status& st);
  void executor_loop();
  void run_group(std::vector<uint64_t> tokens);
  // Rank 0's word on why a failed group's collective could not finish (a rank shut down before it ran), as a
  // cancellation; Ok when it said nothing.
  Status ordered_failure(const std::vector<PartitionView>& views);
  void execute_inline(std::vector<uint64_t>&& group);

  int rank_;
  int size_;
  std::unique_ptr<Negotiator> negotiator_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Item> items_;
  std::deque<std::vector<uint64_t>> queue_;
  uint64_t next_token_ = 1;
  bool accepting_ = true;
  bool stop_executor_ = false;
  Status fatal_;

  std::once_flag shutdown_once_;
  std::thread executor_;
};

}  // namespace commsched::collective
