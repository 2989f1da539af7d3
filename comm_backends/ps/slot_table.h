// The server's summation state: one slot per (key, byte offset, round) collecting the pushes of every worker.
// Transport-free (payloads arrive as Payload objects), so it is unit-testable without sockets.
//
// Streaming mode sums pushes as they arrive (first two in one pass, the rest added in place), in arrival order.
// Deterministic mode keeps every push and sums in rank order once the last arrives: bitwise reproducible.
// Accumulators and sums come from a BufferPool, so memory is reused across rounds; slots are erased when answered,
// so partition boundaries may change from one round to the next.
//
// A lane push (kFlagLane, hierarchical mode) opens a slot that expects `aux` contributors, one worker per machine;
// every other slot expects every worker. Lane slots take no part in joins (hierarchical mode does not join).
//
// Compressed pushes (Header::codec: top-k, signSGD) are decoded into a dense accumulator (f32, or f64 for f64
// tensors), summed (deterministic mode: in rank order), and the sum is encoded again with the same scheme and size.
// Top-k keeps the server's own error feedback: what the answer leaves out is kept per range and added to the next
// round's sum, so everything a worker sent reaches the workers exactly once. signSGD answers with the scaled sign of
// the sum (a majority vote weighted by each worker's scale).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm_backends/ps/buffer_pool.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/sum_kernels.h"
#include "comm_backends/ps/transport.h"
#include "compression/codec.h"

namespace commsched::ps {

inline constexpr uint32_t kNoEntry = UINT32_MAX;

struct Waiter {
  PeerId peer = 0;
  uint32_t rank = 0;
  uint64_t request_id = 0;
  bool gets_data = true;  // false: an empty acknowledgement (the broadcast root)
  uint32_t entry = kNoEntry;  // the entry of push_pull_batch `request_id` this push was (kNoEntry: a push_pull)
};

// What to answer: `waiters` each get `reply` (type sum or bcast_data) carrying `data`, or an error carrying `error`.
struct Outcome {
  Header reply;
  std::vector<Waiter> waiters;
  std::shared_ptr<const std::byte> data;
  std::string error;
};

// A round some workers pushed and others have not (scheduler/stall.h): its slot and who is missing.
struct StalledSlot {
  uint64_t key = 0, offset = 0, round = 0;
  double waited_s = 0;        // since its first push
  std::vector<int> pushed;    // workers whose push came (joined ones stand in)
  std::vector<int> missing;
  std::string describe() const;  // "key 12 offset 0 round 3 waits 61s for worker 2 (pushed by workers 0, 1)"
};

class SlotTable {
 public:
  using Clock = std::chrono::steady_clock;
  SlotTable(uint32_t num_workers, bool deterministic, Summer& summer, std::shared_ptr<BufferPool> pool);
  // One push_pull or bcast message from worker `h.sender_rank` (or entry `entry` of a push_pull_batch, as
  // entry_header makes it). Appends answers that became due to `out`.
  void push(const Header& h, PeerId peer, std::unique_ptr<Payload> payload, std::vector<Outcome>& out,
            uint32_t entry = kNoEntry);
  size_t open_slots() const { return slots_.size(); }
  // Worker `rank` has joined (Horovod's join): it stands in with zeros for every slot it has not pushed to, open now
  // or opened later, until end_joins(). Appends answers that became due to `out`.
  // Returns false (and does nothing) when `rank` had joined already.
  bool join(uint32_t rank, std::vector<Outcome>& out);
  bool all_joined() const;
  // Sync rounds (not a hierarchical lane's) that some workers pushed at least `min_wait_s` before `now` and others
  // have not, longest waiting first.
  std::vector<StalledSlot> stalled(Clock::time_point now, double min_wait_s) const;
  // Answers every push of that round with `message`, and every later one; appends the answers to `out`.
  void fail_stalled(const StalledSlot& slot, const std::string& message, std::vector<Outcome>& out);
  // Every worker has joined: from now on every slot waits for every worker again.
  void end_joins();
  const BufferPool& pool() const { return *pool_; }

 private:
  struct Key {
    uint64_t key, offset, round;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return (k.key * 0x9e3779b97f4a7c15ull) ^ (k.offset * 0xc2b2ae3d27d4eb4full) ^ k.round;
    }
  };
  struct Slot {
    Header first;                                 // the first push: the sizes every other push must match
    uint32_t expected = 0;                        // pushes that complete the slot: every worker, or a lane's
    uint32_t arrived = 0;                         // pushes, and joined workers standing in
    uint32_t summed = 0;                          // pushes with data accumulated so far
    std::vector<bool> seen;                       // by rank
    std::vector<Waiter> waiters;
    std::vector<std::shared_ptr<Payload>> held;   // deterministic: by rank; streaming: [0] until the second push
    std::shared_ptr<std::byte> acc;               // streaming accumulator (accumulator type)
    std::shared_ptr<Payload> bcast_data;          // the broadcast root's payload
    std::string error;                            // set once the slot is poisoned by a mismatch (or a stall)
    Clock::time_point opened;                     // its first push
    compression::Spec spec;                       // compressed pushes: the scheme, from the first push
  };

  struct Range {  // a compressed range's server-side residual: one per (key, offset)
    uint64_t elements = 0;
    std::vector<std::byte> residual;
  };
  std::string mismatch(const Slot& s, const Header& h) const;
  static std::string malformed(const Header& h, const std::string& why);
  // Opens the slot of `h`'s first push: its contributors, the joined workers standing in. Empty, or why not.
  std::string open(Slot& s, const Header& h);
  void accumulate_encoded(Slot& s, const Header& h, std::shared_ptr<Payload> p);
  std::shared_ptr<const std::byte> finish_encoded(Slot& s);
  void accumulate(Slot& s, const Header& h, std::shared_ptr<Payload> p);
  std::shared_ptr<const std::byte> finish_sum(Slot& s);
  void finish_if_complete(std::unordered_map<Key, Slot, KeyHash>::iterator it, std::vector<Outcome>& out);
  Outcome answer(Slot& s, std::vector<Waiter> waiters);
  Outcome error_for(const Slot& s, std::vector<Waiter> waiters) const;

  uint32_t num_workers_;
  bool deterministic_;
  Summer& summer_;
  std::shared_ptr<BufferPool> pool_;
  std::unordered_map<Key, Slot, KeyHash> slots_;
  std::vector<bool> joined_;                        // by rank
  std::unordered_map<Key, Range, KeyHash> ranges_;  // round 0 in the key: one per (key, offset)
};

}  // namespace commsched::ps
