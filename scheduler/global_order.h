// GlobalOrder: the order of collectives over what every rank has ready, a scheduling stage that runs on rank 0 around
// the real scheduling Policy. Pure and single-threaded (no I/O, no clocks: the caller passes the time) so it can be
// tested directly; a collective backend carries its inputs (ready reports, completions) and its output (the order)
// over the wire (comm_backends/collective/negotiator.h) and watches liveness.
//
// It keeps only readiness: which rank has which partition ready, and whether the ranks agree on it (mismatches,
// duplicates and ranks that left become errors). A partition ready on every rank is told to the Policy (the same
// class the engine and the simulator run, driven by the same loop, scheduler/policy_driver.h) as an arriving task;
// the batches the Policy dispatches become the order every rank runs. So FIFO, fusion, MG-WFBP, BSP and bytescheduler
// decide all-reduce exactly as they decide in the simulator, over the partitions ready everywhere.
//
// A batch is one collective unless its partitions differ in op, dtype (or broadcast root): a collective carries one
// of each, so such a batch runs as consecutive groups (in the policy's order) and the policy hears on_batch_done when
// the last of them completes on rank 0 (a collective ends at about the same time on every rank; rank 0's completions
// stand for everyone's). Rank 0 runs groups in order, so completions arrive in order.
//
// Credit: the Policy's credit is the global credit. A per-rank credit in each engine cannot be used with a collective:
// ranks see arrivals at different times, their policies dispatch different partitions, and once every rank's credit
// is full of partitions the others have not dispatched, no collective can start (a distributed deadlock that
// engine_bench reproduces). So with collective backends the engine runs its policy with unlimited credit and hands its
// knobs here whole (BackendCapabilities::global_order, CommBackend::set_knobs), which set_knobs passes to the policy.
//
// Ordering ahead: the policy dispatches whatever is ready the moment it may, and partitions that become ready one by
// one would each become a collective of their own, queued behind the running one. With limit_groups_ahead(n) the
// policy is asked only while fewer than n groups are ordered and not done on rank 0: what becomes ready meanwhile
// waits in the policy, which fuses it (bytescheduler's small tensors) when the running collective ends. Two (one
// running, the next already known to every rank) keeps the ranks busy without a round trip between collectives.
//
// Iteration marks: the global order does not see the end of each rank's backward (the engine tells only its own
// policy). What reaches it has already been released by every rank's engine, so after the arrivals of each flush it
// tells the policy on_flush: a policy that holds tasks for the end of backward (BSP) releases them then.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/policy.h"
#include "scheduler/policy_driver.h"

namespace commsched {

// The vocabulary. A partition is identified across ranks by (task key, offset) plus the task's round; everything else
// about it (bytes, dtype, op, root, task size) must agree on every rank. After a partition has been ordered once, the
// global order gives it a small cache id, and ranks report it by id (16 bytes instead of ~60 plus the name).
inline constexpr uint32_t kNoCacheId = 0xffffffffu;

// What every rank must agree on for one partition.
struct PartitionDesc {
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t task_bytes = 0;
  DType dtype = DType::f32;
  Op op = Op::allreduce;
  int32_t root = 0;

  bool operator==(const PartitionDesc&) const = default;
  // "f32 bytes [0, 400) of a 400-byte allreduce" — for error messages.
  std::string describe() const;
};

// Where a partition sits, independent of round: the key of maps that match reports across ranks and rounds.
struct PartitionSlot {
  uint64_t key;
  uint64_t offset;
  bool operator==(const PartitionSlot&) const = default;
};
struct PartitionSlotHash {
  size_t operator()(const PartitionSlot& s) const { return s.key * 0x9e3779b97f4a7c15ull ^ s.offset; }
};

// One partition a rank reports ready. Either cache_id is set, or desc and name are.
struct ReadyReport {
  uint32_t cache_id = kNoCacheId;
  PartitionDesc desc;
  std::string name;
  uint64_t round = 0;
  int32_t priority = 0;
};

struct OrderEntry {
  uint32_t cache_id = 0;
  uint64_t round = 0;
};

// Newly assigned cache ids, then groups to execute in this order; each group is one (possibly fused) collective.
struct CacheDefine {
  uint32_t cache_id = 0;
  PartitionDesc desc;
};
struct OrderMsg {
  std::vector<CacheDefine> defines;
  std::vector<std::vector<OrderEntry>> groups;
  bool empty() const { return defines.empty() && groups.empty(); }
};

// A partition that can never run (mismatch, a rank left); every rank holding it fails it.
struct ErrorMsg {
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t round = 0;
  Status::Code code = Status::Code::error;
  std::string message;
};


// Where the engine's knobs reach a global order that runs on another thread (rank 0's negotiation): the engine posts
// its whole knob set from its scheduler thread, and the order's owner takes the latest at its next step and hands it
// to GlobalOrder::set_knobs, so every knob reaches the policy through Policy::set_knobs.
class GlobalOrderKnobs {
 public:
  // `on_post` runs on the posting thread after each post (the owner wakes its thread there).
  explicit GlobalOrderKnobs(std::function<void(const Knobs&)> on_post = {}) : on_post_(std::move(on_post)) {}
  void post(const Knobs& knobs) {
    {
      std::lock_guard lock(mu_);
      knobs_ = knobs;
      fresh_.store(true, std::memory_order_release);
    }
    if (on_post_) on_post_(knobs);
  }
  // The knobs posted since the last take, if any.
  std::optional<Knobs> take() {
    if (!fresh_.exchange(false, std::memory_order_acquire)) return std::nullopt;
    std::lock_guard lock(mu_);
    return knobs_;
  }

 private:
  std::function<void(const Knobs&)> on_post_;
  std::mutex mu_;
  Knobs knobs_;
  std::atomic<bool> fresh_{false};
};

struct GlobalOrderOutput {
  OrderMsg order;
  std::vector<ErrorMsg> errors;
  std::optional<int> all_joined;  // every rank has joined: the rank that joined last (tell every rank, after `order`)
  bool empty() const { return order.empty() && errors.empty() && !all_joined; }
};

struct GlobalOrderStats {
  uint64_t reports = 0;         // partitions reported, all ranks
  uint64_t cached_reports = 0;  // of which by cache id
  uint64_t ordered = 0;         // partitions ordered
  uint64_t groups = 0;          // collectives ordered (fused groups count once)
  uint64_t flushes = 0;         // order messages produced
};

class GlobalOrder final : DispatchSink {
 public:
  // `policy` must be fresh (never told an event).
  GlobalOrder(int size, std::unique_ptr<Policy> policy, size_t max_cache_entries = 1u << 20);

  // Records what `rank` has ready. Mismatches and protocol violations go to out.errors.
  void on_ready(int rank, std::span<const ReadyReport> reports, GlobalOrderOutput& out);
  // `rank` is shutting down: whatever is pending can never be ordered.
  void on_bye(int rank, GlobalOrderOutput& out);
  // `rank` has joined (Horovod's join: it has no more data): it counts as ready, with zeros, for every partition the
  // others report until every rank has joined; then out.all_joined names it and partitions wait for all again.
  void on_join(int rank, GlobalOrderOutput& out);
  // Tells the policy what became ready on every rank since the last flush and orders what it dispatches now.
  void flush(Nanos now, GlobalOrderOutput& out);
  // Rank 0 finished the oldest group still running. Call flush() afterwards: the policy may dispatch more.
  void on_group_done(Nanos now);
  // When flush() must run again even if nothing arrives (a fusion cycle); nullopt: none (or only a completion can
  // let the policy dispatch: limit_groups_ahead).
  std::optional<Nanos> next_wakeup() const {
    return held_back() ? std::nullopt : policy_->next_wakeup();
  }
  // At most `groups` ordered and not yet done on rank 0 before the policy is asked for more (0: no limit).
  void limit_groups_ahead(size_t groups) { max_ahead_ = groups; }
  // The knobs rank 0's policy uses (credit, small-tensor fusion bound, ...); the partition size is each rank's engine's.
  void set_knobs(const Knobs& k) { driver_.set_knobs(k); }
  uint64_t bytes_in_flight() const { return policy_->bytes_in_flight(); }
  const Policy& policy() const { return *policy_; }

  // Partitions not yet ordered: reported by some ranks, or ready everywhere and held by the policy.
  size_t pending() const { return pending_.size() + policy_->queued_partitions(); }
  const GlobalOrderStats& stats() const { return stats_; }

 private:
  using Slot = PartitionSlot;
  using SlotHash = PartitionSlotHash;
  struct Entry {
    PartitionDesc desc;
    std::string name;
    uint64_t round = 0;
    int32_t priority = 0;
    uint64_t seq = 0;          // first-report order: the policy's task id and tie-break after priority
    int first_rank = 0;        // whose description is recorded
    std::vector<bool> reported;
    int count = 0;
    std::string poisoned;      // non-empty: this partition fails on every rank
  };
  struct CachedDesc {
    PartitionDesc desc;
    std::string name;
  };
  // A policy batch while its groups run; the policy hears on_batch_done when none is left.
  struct Running {
    Batch batch;
    size_t groups_left = 0;
  };

  void record(int rank, const ReadyReport& rep, const PartitionDesc& desc, const std::string& name, GlobalOrderOutput& out);
  void poison(Entry& e, uint64_t round, std::string message, Status::Code code, GlobalOrderOutput& out);
  std::string mismatch_message(const Entry& e, int rank, const PartitionDesc& desc, uint64_t round) const;
  uint32_t cache_id_for(const Entry& e, OrderMsg& order);
  bool fusable(const PartitionDesc& a, const PartitionDesc& b) const;
  void tell_arrivals(Nanos now);
  // Turns one policy batch into groups of the order; returns how many.
  size_t order_batch(const Batch& batch, GlobalOrderOutput& out);
  bool held_back() const { return max_ahead_ > 0 && running_.size() >= max_ahead_; }
  // DispatchSink: a policy batch becomes groups of the order being built (out_).
  bool dispatch(Batch& batch, Nanos now) override;
  bool may_poll() const override { return !held_back(); }

  int size_;
  std::unique_ptr<Policy> policy_;
  PolicyDriver driver_;  // the engine's loop (scheduler/policy_driver.h)
  GlobalOrderOutput* out_ = nullptr;  // the order flush() is building
  bool ordered_ = false;              // flush() ordered a group
  size_t max_cache_entries_;
  size_t max_ahead_ = 0;
  uint64_t next_seq_ = 0;
  std::unordered_map<Slot, Entry, SlotHash> pending_;
  std::vector<Slot> complete_;                 // ready on every rank, not yet told to the policy
  std::unordered_map<uint64_t, Entry> held_;   // seq -> told to the policy, not yet dispatched
  std::deque<std::shared_ptr<Running>> running_;  // one per group ordered and not yet done on rank 0, in order
  std::vector<CachedDesc> cache_;              // cache id -> description
  std::unordered_map<Slot, uint32_t, SlotHash> cache_index_;
  std::vector<bool> gone_;                     // ranks that said bye
  std::vector<bool> joined_;                   // ranks that joined since every rank last had
  GlobalOrderStats stats_;
};

}  // namespace commsched
