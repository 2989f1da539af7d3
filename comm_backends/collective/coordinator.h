// The decision logic of the order negotiation, run by rank 0. Pure and single-threaded (no I/O, no clocks) so it can
// be tested directly: it is told which partitions each rank has ready and answers the order in which every rank runs
// them, plus errors for partitions that can never run.
//
// A partition is ordered once every rank has reported it. Partitions that become ready everywhere in the same flush
// are ordered by priority (lower first), then by first report; consecutive small ones of the same op/dtype/root are
// fused into one group up to `fusion_bytes`.
//
// Credit: with credit_bytes > 0 the coordinator keeps at most that many bytes ordered but not yet completed (rank 0's
// completions stand for everyone's: a collective ends at about the same time on every rank) and holds the rest in
// priority order. This is ByteScheduler's credit made global. A per-rank credit in each engine cannot be used with a
// collective: ranks see arrivals at different times, their policies dispatch different partitions, and once every
// rank's credit is full of partitions the others have not dispatched, no collective can start (a distributed deadlock
// that engine_bench reproduces). So with collective backends run the engine with unlimited credit and give the credit
// to the coordinator (COMMSCHED_COLLECTIVE_CREDIT_BYTES).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm_backends/collective/protocol.h"

namespace commsched::collective {

struct CoordinatorOutput {
  OrderMsg order;
  std::vector<ErrorMsg> errors;
  bool empty() const { return order.empty() && errors.empty(); }
};

struct CoordinatorStats {
  uint64_t reports = 0;         // partitions reported, all ranks
  uint64_t cached_reports = 0;  // of which by cache id
  uint64_t ordered = 0;         // partitions ordered
  uint64_t groups = 0;          // collectives ordered (fused groups count once)
  uint64_t flushes = 0;         // order messages produced
};

class Coordinator {
 public:
  // fusion_bytes == 0 disables fusion.
  // credit_bytes == 0: no limit (order everything as soon as it is ready everywhere).
  Coordinator(int size, uint64_t fusion_bytes, uint64_t credit_bytes = 0, size_t max_cache_entries = 1u << 20);

  // Records what `rank` has ready. Mismatches and protocol violations go to out.errors.
  void on_ready(int rank, std::span<const ReadyReport> reports, CoordinatorOutput& out);
  // `rank` is shutting down: whatever is pending can never be ordered.
  void on_bye(int rank, CoordinatorOutput& out);
  // Orders what is ready on every rank, most urgent first, within the credit.
  void flush(CoordinatorOutput& out);
  // Rank 0 finished collectives of `bytes`: credit to order more.
  void on_completed(uint64_t bytes);
  void set_credit_bytes(uint64_t credit) { credit_bytes_ = credit; }
  uint64_t bytes_in_flight() const { return inflight_bytes_; }

  size_t pending() const { return pending_.size() + ready_.size(); }
  const CoordinatorStats& stats() const { return stats_; }

 private:
  using Slot = PartitionSlot;
  using SlotHash = PartitionSlotHash;
  struct Entry {
    PartitionDesc desc;
    std::string name;
    uint64_t round = 0;
    int32_t priority = 0;
    uint64_t seq = 0;          // first-report order, tie-break after priority
    int first_rank = 0;        // whose description is recorded
    std::vector<bool> reported;
    int count = 0;
    std::string poisoned;      // non-empty: this partition fails on every rank
  };
  struct CachedDesc {
    PartitionDesc desc;
    std::string name;
  };

  void record(int rank, const ReadyReport& rep, const PartitionDesc& desc, const std::string& name, CoordinatorOutput& out);
  void poison(Entry& e, uint64_t round, std::string message, Status::Code code, CoordinatorOutput& out);
  std::string mismatch_message(const Entry& e, int rank, const PartitionDesc& desc, uint64_t round) const;
  uint32_t cache_id_for(const Entry& e, OrderMsg& order);
  bool fusable(const PartitionDesc& a, const PartitionDesc& b) const;
  bool credit_allows(uint64_t bytes) const;

  int size_;
  uint64_t fusion_bytes_;
  uint64_t credit_bytes_;
  uint64_t inflight_bytes_ = 0;
  size_t max_cache_entries_;
  uint64_t next_seq_ = 0;
  std::unordered_map<Slot, Entry, SlotHash> pending_;
  std::vector<Slot> complete_;                // ready on every rank, awaiting flush
  std::map<std::pair<int32_t, uint64_t>, Entry> ready_;  // (priority, seq) -> ready everywhere, held by the credit
  std::vector<CachedDesc> cache_;             // cache id -> description
  std::unordered_map<Slot, uint32_t, SlotHash> cache_index_;
  std::vector<bool> gone_;                    // ranks that said bye
  CoordinatorStats stats_;
};

}  // namespace commsched::collective
