// The partitions waiting in PriorityCreditPolicy, most urgent first: lowest priority value, then earliest seq, then
// lowest offset, the order a heap of every partition gives, but kept as a heap of tasks. A task's partitions share
// its priority and seq and arrive in offset order (TaskArrival), so within a task they leave in arrival order, and
// only the tasks need ordering among themselves. The simulator runs one such queue per worker, hundreds at once, and
// a heap of thousands of partitions each missed the cache on every level of every pop; a heap of a model's tasks (a
// few hundred, each pop in cache) and each task's partitions read in order cost a fraction of that. Partitions that
// break the promise (a priority, seq or offset out of step with the one before) start a run of their own, which the
// heap orders like any task, so the order is the same for any input.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "scheduler/policy.h"

namespace commsched {

class PartQueue {
 public:
  struct Entry {
    PartRef part;
    uint64_t task_bytes;  // the whole task's bytes (the small-tensor fusion reads it)
  };

  // Queues a task's partitions.
  void push(std::span<const PartRef> parts, uint64_t task_bytes) {
    size_t begin = 0;
    for (size_t i = 1; i <= parts.size(); ++i) {
      if (i < parts.size() && continues(parts[i - 1], parts[i])) continue;
      push_run(parts.subspan(begin, i - begin), task_bytes);
      begin = i;
    }
  }
  bool empty() const { return runs_.empty(); }
  size_t size() const { return size_; }
  // The most urgent partition (not empty()).
  Entry top() const {
    const Run& r = runs_.front();
    return {r.parts[r.next], r.task_bytes};
  }
  void pop() {
    std::pop_heap(runs_.begin(), runs_.end(), LessUrgent{});
    Run& r = runs_.back();
    --size_;
    if (++r.next == r.parts.size()) {
      runs_.pop_back();
      return;
    }
    r.offset = r.head().offset;
    std::push_heap(runs_.begin(), runs_.end(), LessUrgent{});
  }

 private:
  // Consecutive partitions of one task: its priority and seq, offsets increasing. The head's order key is kept in
  // the run itself, so that ordering the heap reads the runs only, not each run's partitions elsewhere in memory.
  struct Run {
    std::vector<PartRef> parts;
    size_t next = 0;  // the first still queued
    uint64_t task_bytes = 0;
    int32_t priority = 0;  // the head's (every partition's) priority and seq, and the head's offset
    uint64_t seq = 0;
    uint64_t offset = 0;
    const PartRef& head() const { return parts[next]; }
  };
  // std heaps keep the "largest" on top, so "less urgent" compares as smaller.
  struct LessUrgent {
    bool operator()(const Run& a, const Run& b) const {
      if (a.priority != b.priority) return a.priority > b.priority;
      if (a.seq != b.seq) return a.seq > b.seq;
      return a.offset > b.offset;
    }
  };
  static bool continues(const PartRef& before, const PartRef& p) {
    return p.priority == before.priority && p.seq == before.seq && p.offset > before.offset;
  }
  void push_run(std::span<const PartRef> parts, uint64_t task_bytes) {
    if (parts.empty()) return;
    const PartRef& head = parts.front();
    runs_.push_back({std::vector<PartRef>(parts.begin(), parts.end()), 0, task_bytes, head.priority, head.seq,
                     head.offset});
    std::push_heap(runs_.begin(), runs_.end(), LessUrgent{});
    size_ += parts.size();
  }

  std::vector<Run> runs_;
  size_t size_ = 0;
};

}  // namespace commsched
