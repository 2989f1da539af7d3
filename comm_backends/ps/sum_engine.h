// The server's summation engine (as BytePS's server engine threads): the summation state (SlotTable, AsyncTable) is
// split into shards, each with a thread of its own, so that the server's I/O thread receives the next message while
// earlier pushes are summed, and pushes of different partitions are summed on several cores at once.
//
// Exactness: a sync partition (key, offset) and an async tensor (key) live in one shard, and each shard takes its work
// in arrival order, so every slot sums the same pushes in the same order as a single-threaded server did
// (deterministic mode still sums in rank order). Joins reach every shard, behind the pushes that arrived before them.
//
// Small pushes are summed inline, on the I/O thread, when their shard has nothing queued: handing a few KiB to another
// thread and its answer back costs more than summing them (and, on a loaded machine, two waits for a core). So are a
// sole worker's sync pushes of any size, which need no summing at all.
//
// Threading: every call but the constructor's `ready` comes from one thread (the server's I/O thread). Answers of work
// done on a shard's thread are kept for drain(); `ready` runs on that thread each time some are added, so the I/O
// thread can be woken (Transport::wake) to send them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm_backends/ps/async_table.h"
#include "comm_backends/ps/slot_table.h"

namespace commsched::ps {

class SumEngine {
 public:
  struct Options {
    int shards = 1;  // threads summing in parallel
    uint32_t num_workers = 1;
    bool deterministic = false;
    std::optional<uint64_t> staleness;  // AsyncTable's bound
    uint64_t inline_bytes = 64 << 10;   // pushes up to this size may be summed on the I/O thread
  };
  SumEngine(const Options& opts, Summer& summer, std::shared_ptr<BufferPool> pool, std::function<void()> ready);
  ~SumEngine();
  SumEngine(const SumEngine&) = delete;
  SumEngine& operator=(const SumEngine&) = delete;

  // A push of the SlotTable (`async` false) or the AsyncTable (true), as SlotTable::push / AsyncTable::push take it.
  // Answers that are due at once (summed inline) are appended to `out`; the others come out of drain().
  void push(bool async, const Header& h, PeerId peer, std::unique_ptr<Payload> payload, std::vector<Outcome>& out,
            uint32_t entry = kNoEntry);
  // Worker `rank` joins every shard, after everything submitted before; returns once every shard has taken it, with
  // every answer released so far in drain(). False when `rank` had joined already.
  bool join(uint32_t rank);
  // Every worker has joined (SlotTable::all_joined), and ending that on every shard (as join() waits).
  bool all_joined();
  void end_joins();
  // Every shard's stalled sync rounds (SlotTable::stalled), longest waiting first.
  std::vector<StalledSlot> stalled(SlotTable::Clock::time_point now, double min_wait_s);
  // Fails one on its shard (SlotTable::fail_stalled); the answers are appended to `out`.
  void fail_stalled(const StalledSlot& slot, const std::string& message, std::vector<Outcome>& out);
  // Answers of work done on the shards' threads since the last call, appended to `out`.
  void drain(std::vector<Outcome>& out);
  // Drops the work not started, waits for what runs, ends the threads. Idempotent; the destructor calls it.
  void stop();
  int shards() const { return static_cast<int>(shards_.size()); }

 private:
  struct Work {
    enum class Kind { sync_push, async_push, join, end_joins } kind;
    Header h;
    PeerId peer = 0;
    std::unique_ptr<Payload> payload;
    uint32_t entry = kNoEntry;
    uint32_t rank = 0;
  };
  struct Shard {
    Shard(const Options& o, Summer& summer, const std::shared_ptr<BufferPool>& pool)
        : slots(o.num_workers, o.deterministic, summer, pool), async(o.num_workers, o.staleness, summer, pool) {}
    SlotTable slots;
    AsyncTable async;
    std::mutex state_mu;  // held while the tables are used; the shard's thread takes the queue's work under it
    std::mutex queue_mu;
    std::condition_variable queue_cv;
    std::deque<Work> queue;
    bool stopping = false;
    bool joined_result = false;  // the last join's SlotTable::join
    std::thread thread;
  };
  Shard& shard_of(const Header& h, bool async);
  void run(Shard& s, Work& w, std::vector<Outcome>& out);
  void loop(Shard& s);
  void enqueue(Shard& s, Work w);
  // Runs `w` (a join or end_joins) on every shard behind their queued work and waits for all.
  void everywhere(Work::Kind kind, uint32_t rank);

  uint64_t inline_bytes_;
  bool sole_worker_;  // one worker: a sync push is answered with itself, nothing to sum
  std::function<void()> ready_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::vector<Outcome> done_;
  size_t barrier_left_ = 0;  // shards still to take the work of everywhere()
};

}  // namespace commsched::ps
