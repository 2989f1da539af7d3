// The decision logic of the order negotiation, run by rank 0. Pure and single-threaded (no I/O, no clocks) so it can
// be tested directly: it is told which partitions each rank has ready and answers the order in which every rank runs
// them, plus errors for partitions that can never run.
//
// A partition is ordered once every rank has reported it. Partitions that become ready everywhere in the same flush
// are ordered by priority (lower first), then by first report; consecutive small ones of the same op/dtype/root are
// fused into one group up to `fusion_bytes`. Bandwidth scheduling (credit) stays in each rank's engine: a rank only
// reports what its policy dispatched, so the negotiator adds no queue of its own.
#pragma once

#include <cstdint>
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
  Coordinator(int size, uint64_t fusion_bytes, size_t max_cache_entries = 1u << 20);

  // Records what `rank` has ready. Mismatches and protocol violations go to out.errors.
  void on_ready(int rank, std::span<const ReadyReport> reports, CoordinatorOutput& out);
  // `rank` is shutting down: whatever is pending can never be ordered.
  void on_bye(int rank, CoordinatorOutput& out);
  // Orders everything that became ready on every rank since the last flush.
  void flush(CoordinatorOutput& out);

  size_t pending() const { return pending_.size(); }
  const CoordinatorStats& stats() const { return stats_; }

 private:
  struct Slot {
    uint64_t key;
    uint64_t offset;
    bool operator==(const Slot&) const = default;
  };
  struct SlotHash {
    size_t operator()(const Slot& s) const { return s.key * 0x9e3779b97f4a7c15ull ^ s.offset; }
  };
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

  int size_;
  uint64_t fusion_bytes_;
  size_t max_cache_entries_;
  uint64_t next_seq_ = 0;
  std::unordered_map<Slot, Entry, SlotHash> pending_;
  std::vector<Slot> complete_;                // ready on every rank, awaiting flush
  std::vector<CachedDesc> cache_;             // cache id -> description
  std::unordered_map<Slot, uint32_t, SlotHash> cache_index_;
  std::vector<bool> gone_;                    // ranks that said bye
  CoordinatorStats stats_;
};

}  // namespace commsched::collective
