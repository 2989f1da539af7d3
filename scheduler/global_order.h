// GlobalOrder: the order of collectives over what every rank has ready, a scheduling stage that runs on rank 0 around
// the engine's own Policy (handed over through GlobalOrderInbox, see "Credit"). Pure and single-threaded (no I/O, no clocks: the caller passes the time) so it can be
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
// engine_bench reproduces). So over a collective backend the engine hands its own Policy here
// (BackendCapabilities::global_order, GlobalOrderInbox) and forwards each rank's partitions as they arrive
// (scheduler/forward_policy.h): no second policy runs anywhere, and the engine's knobs reach this one whole.
//
// Ordering ahead: the policy dispatches whatever is ready the moment it may, and partitions that become ready one by
// one would each become a collective of their own, queued behind the running one. With limit_groups_ahead(n) the
// policy is asked only while fewer than n groups are ordered and not done on rank 0: what becomes ready meanwhile
// waits in the policy, which fuses it (bytescheduler's small tensors) when the running collective ends. Two (one
// running, the next already known to every rank) keeps the ranks busy without a round trip between collectives.
//
// Vouching (set_vouching): rank 0 tells the policy a partition as ready everywhere as soon as rank 0 itself reports
// it, provided every rank ran it before under the same description (rank 0 reports it by cache id) and no rank has
// shut down. The others' reports of it still come and are only counted off. This takes a one-way message (the
// others' report reaching rank 0) off every step's critical path: the order reaches a rank at about the moment its own
// submission does. The other ranks run the order as their submissions come (comm_backends/collective/negotiator.h); a
// rank whose submission then differs fails the group, naming the partition (nothing can be sent back through a
// collective already ordered). A rank that never submits what rank 0 vouched for leaves rank 0 waiting in the
// collective until the transport's timeout, where without vouching the partition would never have been ordered. A
// rank that shuts down instead is told to every rank as an error for each such partition ("rank R shut down before
// it ran"), which explains the collective's failure better than the transport's closed connection.
//
// Iteration marks: a policy that waits for the end of backward (BSP) or learns from it (MG-WFBP) hears it here as the
// end of every rank's backward. Each rank's engine sends its end of backward (and its flushes) after the partitions
// it covers (an IterationMark: how many partitions that rank had reported by then), so once every rank's next mark
// is covered by what it reported, every partition of the iteration is ready everywhere: the policy is told those
// arrivals, then on_backward_done (on_flush when some rank's mark was a flush). Ranks that joined or left do not
// hold a mark back. A driver that sends no marks (a backend driven without an engine) gets on_flush after the
// arrivals of every flush instead, so such a policy never waits for a mark that does not come.
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

// "task 'name' (key 0x...)": how errors about a partition name its tensor.
std::string task_label(const std::string& name, uint64_t key);

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


// A tensor some ranks submitted and the others have not, for a while (stall reports, as Horovod's stall inspector
// makes them): every rank must submit the same collectives under the same names, and one that submits another name
// (a counter that differs, a step it skipped) or never gets there leaves the others waiting with no error.
struct StalledTask {
  std::string name;
  uint64_t key = 0;
  Nanos waited = 0;          // since the first rank reported it
  std::vector<int> ready;    // ranks that submitted it
  std::vector<int> missing;  // ranks that have not (ranks that joined or left aside)
};
// "task 'a' (key 0x..) waits 61 s for rank 2 (ready on ranks 0, 1); ..." at most `limit` tasks, then how many more.
std::string describe_stalls(const std::vector<StalledTask>& stalls, size_t limit = 8);

// One rank's end of backward (or flush): it covers the first `after` partitions that rank reported ready.
struct IterationMark {
  bool backward = true;  // false: a flush (Engine::flush)
  uint64_t after = 0;
};

// Where the driver of a collective backend (an Engine) hands rank 0's global order its Policy and its knobs from its
// own thread; the order's owner (rank 0's negotiation) takes them at its next step and gives them to GlobalOrder, so
// the engine's own policy orders every rank's partitions and every knob reaches it through Policy::set_knobs. Every
// rank's engine hands its policy over alike; only rank 0's is taken (the others' stay unused here). Thread-safe.
class GlobalOrderInbox {
 public:
  // `posted` runs on the posting thread after each adopt() and post() (the owner wakes its thread there); `marked`
  // carries this rank's iteration marks to rank 0 (mark()).
  explicit GlobalOrderInbox(std::function<void()> posted = {}, std::function<void(bool backward)> marked = {})
      : posted_(std::move(posted)), marked_(std::move(marked)) {}

  // The policy that orders: once, before the first partition is ordered. Throws InvalidArgument for a second policy
  // (a second engine over one backend) or after the order started with its default (GlobalOrder::flush). `marks`:
  // every rank's driver calls mark() at each end of backward and flush (an engine does), so the policy hears them.
  void adopt(std::unique_ptr<Policy> policy, bool marks = false);
  void post(const Knobs& knobs);
  // This rank's end of backward (true) or flush, called after starting every batch it covers.
  void mark(bool backward) {
    if (marked_) marked_(backward);
  }

  // The owner's side. take_policy: the adopted policy, once; `last_chance`: the order needs one now, so when none has
  // come, none is accepted any more.
  struct Adopted {
    std::unique_ptr<Policy> policy;
    bool marks = false;
  };
  Adopted take_policy(bool last_chance = false);
  // The knobs posted since the last take, if any.
  std::optional<Knobs> take();

 private:
  std::function<void()> posted_;
  std::function<void(bool)> marked_;
  std::mutex mu_;
  std::unique_ptr<Policy> policy_;
  bool marks_ = false;
  bool adopted_ = false;  // a policy came (taken or not)
  bool closed_ = false;   // the order runs its default: no policy is accepted
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
  uint64_t vouched = 0;         // partitions rank 0 vouched for (ordered before the others reported them)
};

class GlobalOrder final : DispatchSink {
 public:
  // `policy` must be fresh (never told an event); null: adopt() hands it over later (before the first partition is
  // ready everywhere, or flush() takes the default).
  explicit GlobalOrder(int size, std::unique_ptr<Policy> policy = nullptr, size_t max_cache_entries = 1u << 20);

  // The Policy that orders (an engine's own, GlobalOrderInbox): fresh, and before any partition was told to a policy.
  // Knobs set before it came apply to it first. `marks`: every rank sends iteration marks (on_mark).
  void adopt(std::unique_ptr<Policy> policy, bool marks = false);
  bool has_policy() const { return policy_ != nullptr; }
  // Partitions are ready everywhere and no policy has come: flush() would start with the default.
  bool needs_policy() const { return !policy_ && !complete_.empty(); }

  // Records what `rank` has ready at `now` (the time stalled() counts from). Mismatches and protocol violations go
  // to out.errors.
  void on_ready(int rank, std::span<const ReadyReport> reports, GlobalOrderOutput& out, Nanos now = 0);
  // Tasks reported by some ranks at least `min_wait` before `now` and not by the others, longest waiting first, one
  // per task (its partition waiting longest).
  std::vector<StalledTask> stalled(Nanos now, Nanos min_wait) const;
  // Fails every partition of task `key` still waiting for reports, on every rank that holds it or reports it later.
  void fail_stalled(uint64_t key, const std::string& message, GlobalOrderOutput& out);
  // `rank` is shutting down: whatever is pending can never be ordered.
  void on_bye(int rank, GlobalOrderOutput& out);
  // `rank` has joined (Horovod's join: it has no more data): it counts as ready, with zeros, for every partition the
  // others report until every rank has joined; then out.all_joined names it and partitions wait for all again.
  void on_join(int rank, GlobalOrderOutput& out);
  // Tells the policy what became ready on every rank since the last flush and orders what it dispatches now. With
  // nothing adopted yet it adopts the default first (for a backend driven without an engine): bytescheduler with the
  // knobs set so far (no credit, no fusion unless they say so).
  void flush(Nanos now, GlobalOrderOutput& out);
  // `rank`'s end of backward or flush (see "Iteration marks" above); told to the policy by a later flush().
  void on_mark(int rank, const IterationMark& mark);
  // Rank 0 finished the oldest group still running. Call flush() afterwards: the policy may dispatch more.
  void on_group_done(Nanos now);
  // When flush() must run again even if nothing arrives (a fusion cycle); nullopt: none (or only a completion can
  // let the policy dispatch: limit_groups_ahead).
  std::optional<Nanos> next_wakeup() const {
    return held_back() || !policy_ ? std::nullopt : policy_->next_wakeup();
  }
  // At most `groups` ordered and not yet done on rank 0 before the policy is asked for more (0: no limit).
  void limit_groups_ahead(size_t groups) { max_ahead_ = groups; }
  // Rank 0 vouches for partitions every rank ran before under the same description (see "Vouching" above).
  void set_vouching(bool on) { vouch_ = on; }
  // The knobs rank 0's policy uses (credit, small-tensor fusion bound, ...); the partition size is each rank's engine's.
  // Before a policy has come they wait for it. A fusion bound of 0 means auto_fusion_bytes (set_auto_fusion).
  void set_knobs(Knobs k);
  // What a small-tensor fusion bound of 0 stands for: the collective's automatic fusion (0: none).
  void set_auto_fusion(uint64_t bytes) { auto_fusion_bytes_ = bytes; }
  // The owner's step before flush(): adopts the policy handed over through `inbox` (when none has come and one is
  // needed now, none is accepted any more: flush() takes the default) and applies the knobs posted there.
  void take_from(GlobalOrderInbox& inbox);
  uint64_t bytes_in_flight() const { return policy_ ? policy_->bytes_in_flight() : 0; }

  // Partitions not yet ordered: reported by some ranks, or ready everywhere and held by the policy.
  size_t pending() const { return pending_.size() + (policy_ ? policy_->queued_partitions() : 0); }
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
    Nanos since = 0;           // when the first report came
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

  void record(int rank, const ReadyReport& rep, const PartitionDesc& desc, const std::string& name, Nanos now,
              GlobalOrderOutput& out);
  // A new entry's description and order, first reported by `rank`.
  void start_entry(Entry& e, int rank, const ReadyReport& rep, const PartitionDesc& desc, const std::string& name);
  // Rank 0's cached report: ready everywhere now, when vouching may (true); the others' reports are then expected.
  bool vouch(const ReadyReport& rep, const PartitionDesc& desc, const std::string& name, Nanos now);
  // `rank`'s report of a partition rank 0 vouched for: counted off (true).
  bool vouched_report(int rank, const Slot& slot, uint64_t round);
  // `rank` will report nothing more (joined or gone): no vouched partition waits for its report.
  void forget_vouched(int rank);
  // `rank` shut down: every partition rank 0 vouched for and already ordered that it had not reported fails, naming it
  // (its collective cannot finish without that rank). One not yet ordered is left alone: it still runs (on_bye keeps
  // complete entries) and its order will name it, which every rank must still find pending.
  void fail_vouched(int rank, GlobalOrderOutput& out);
  bool not_yet_ordered(const Slot& slot, uint64_t round) const;  // still gathering, or held by the policy
  void poison(Entry& e, uint64_t round, std::string message, Status::Code code, GlobalOrderOutput& out);
  std::string mismatch_message(const Entry& e, int rank, const PartitionDesc& desc, uint64_t round) const;
  uint32_t cache_id_for(const Entry& e, OrderMsg& order);
  bool fusable(const PartitionDesc& a, const PartitionDesc& b) const;
  void tell_arrivals(Nanos now);
  // Tells the policy every mark that every rank's reports now cover.
  void tell_marks(Nanos now);
  // Turns one policy batch into groups of the order; returns how many.
  size_t order_batch(const Batch& batch, GlobalOrderOutput& out);
  bool held_back() const { return max_ahead_ > 0 && running_.size() >= max_ahead_; }
  // DispatchSink: a policy batch becomes groups of the order being built (out_).
  bool dispatch(Batch& batch, Nanos now) override;
  bool may_poll() const override { return !held_back(); }

  int size_;
  std::unique_ptr<Policy> policy_;
  std::optional<PolicyDriver> driver_;  // the engine's loop (scheduler/policy_driver.h), once a policy has come
  std::optional<Knobs> knobs_;          // set before a policy came
  uint64_t auto_fusion_bytes_ = 0;
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
  bool marks_ = false;                         // the ranks send iteration marks
  std::vector<uint64_t> reported_;             // partitions each rank reported, in all
  std::vector<std::deque<IterationMark>> marks_waiting_;  // each rank's marks not yet told
  // Vouched partitions whose reports from the other ranks have not all come: (slot, round) -> ranks still to report.
  struct VouchKey {
    Slot slot;
    uint64_t round;
    bool operator==(const VouchKey&) const = default;
  };
  struct VouchKeyHash {
    size_t operator()(const VouchKey& k) const { return SlotHash{}(k.slot) ^ (k.round * 0xff51afd7ed558ccdull); }
  };
  struct Vouched {
    std::vector<bool> expect;  // the ranks whose report of it has not come
    std::string name;          // for the error when one of them shuts down
    Nanos since = 0;           // when rank 0 vouched (stalled() counts from there)
  };
  bool vouch_ = false;
  std::unordered_map<VouchKey, Vouched, VouchKeyHash> vouched_;
  // Partitions fail_stalled() failed, by (slot, round): the error for the ranks whose reports had not come, which get
  // it when they do (their entry is gone, so the others' next round starts afresh).
  struct StallFailed {
    std::vector<bool> expect;
    std::string message;
  };
  std::unordered_map<VouchKey, StallFailed, VouchKeyHash> stall_failed_;
  // A stalled task's line for the partition `key` of `name`, waiting since `since`; `reported(r)` says whether rank r
  // submitted it. Keeps the longest wait per task in `by_key`.
  template <class Reported>
  void add_stall(std::unordered_map<uint64_t, StalledTask>& by_key, uint64_t key, const std::string& name,
                 Nanos waited, Reported reported) const;
  // The stall-failed error for `rank`'s late report of (slot, round), if any (true: told).
  bool stall_failed_report(int rank, const Slot& slot, uint64_t round, GlobalOrderOutput& out);
  GlobalOrderStats stats_;
};

}  // namespace commsched
