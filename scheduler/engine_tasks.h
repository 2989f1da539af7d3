// The engine's task table: what a submitted task carries through the engine, the submit side's bookkeeping (names
// in flight, per-name rounds, dense ids) and the wait side (how many tasks are outstanding, the first failure since
// the last wait_all). Thread-safe where it says so; TaskState itself belongs to one thread at a time (the submitter,
// then the partition node, then the scheduler node).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "scheduler/policy.h"
#include "scheduler/task.h"

namespace commsched {

struct TaskState {
  TaskDesc desc;
  TaskCallback callback;
  std::vector<PartRef> parts;
  uint32_t remaining = 0;   // partitions not yet completed
  uint32_t in_flight = 0;   // partitions dispatched and not yet back (an engine fault waits for them)
  bool staged = false;      // some stage applies to this task
  Status status;
  Nanos submitted = 0;
  Nanos first_dispatch = -1;
};

// Finished TaskStates kept for the next submissions. A TaskState is made on the submitting thread and freed on the
// scheduler thread, and memory freed on another thread than the one that allocated it takes malloc's slow path on
// both sides; with the partition list that comes with it that was two such round trips per task, a quarter of the
// engine's CPU per partition (engine_micro_bench, EnginePerPartition). Reuse keeps the partition list's capacity too.
// Thread-safe; holds at most kKeep states.
class TaskPool {
 public:
  std::unique_ptr<TaskState> take();             // a reset TaskState (new when none is kept)
  void recycle(std::unique_ptr<TaskState> t);    // resets it and keeps it, or frees it when kKeep are kept

 private:
  static constexpr size_t kKeep = 4096;
  std::mutex mu_;
  std::vector<std::unique_ptr<TaskState>> free_;
};

// Submit-side registry: unique names in flight, the per-name round counter and dense task ids (in submission order).
class TaskRegistry {
 public:
  // Reserves `name` and returns (id, round); throws InvalidArgument when a task of that name is still in flight.
  std::pair<uint64_t, uint64_t> admit(const std::string& name);
  // The task finished, or was refused after admit(): the name may be submitted again.
  void release(const std::string& name);
  uint64_t submitted() const;  // ids handed out so far
  // Every name's round starts again from 0 (after a join, on every rank alike). Nothing may be in flight.
  void restart_rounds();

 private:
  mutable std::mutex mu_;
  struct Name {
    uint64_t round = 0;      // the next round of this name
    bool in_flight = false;
  };
  // One entry per name ever submitted: admitting a known name allocates nothing.
  std::unordered_map<std::string, Name> names_;
  uint64_t next_id_ = 0;
};

// Outstanding tasks and the first failure since the last wait.
class WaitGroup {
 public:
  void add();
  void remove();  // undoes add() for a task refused before it was queued
  // A task finished; `failure` (if not ok) is remembered for the next wait() that returns it.
  void done(const Status& failure);
  // Blocks until nothing is outstanding; returns the first failure recorded since the previous wait (and forgets it).
  Status wait();
  bool wait_for(std::chrono::nanoseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t outstanding_ = 0;
  Status first_failure_;
};

}  // namespace commsched
