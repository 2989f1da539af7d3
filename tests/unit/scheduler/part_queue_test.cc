// PartQueue keeps tasks in a heap and each task's partitions in order; it must hand out partitions in exactly the
// order one heap of every partition would (priority, then seq, then offset), whatever the tasks look like.
#include "scheduler/part_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <queue>
#include <random>
#include <vector>

namespace commsched {
namespace {

struct LessUrgent {  // the order PriorityCreditPolicy promises
  bool operator()(const PartRef& a, const PartRef& b) const {
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.seq != b.seq) return a.seq > b.seq;
    return a.offset > b.offset;
  }
};

std::vector<PartRef> random_task(std::mt19937& rng, uint64_t id, bool scrambled) {
  std::vector<PartRef> parts;
  const uint32_t n = 1 + rng() % 6;
  const int32_t priority = int32_t(rng() % 5);
  for (uint32_t i = 0; i < n; ++i) parts.push_back({id, i, priority, id, uint64_t(i) * 100, 100});
  if (scrambled) {  // out of offset order, and one partition with a priority of its own
    std::shuffle(parts.begin(), parts.end(), rng);
    parts.back().priority = priority + 1;
  }
  return parts;
}

TEST(PartQueue, SameOrderAsAHeapOfEveryPartition) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    PartQueue queue;
    std::priority_queue<PartRef, std::vector<PartRef>, LessUrgent> reference;
    std::vector<uint64_t> task_bytes;
    for (uint64_t id = 0; id < 40; ++id) {
      const std::vector<PartRef> task = random_task(rng, id, round % 4 == 0 && id % 3 == 0);
      task_bytes.push_back(100 * task.size());
      queue.push(task, task_bytes.back());
      for (const PartRef& p : task) reference.push(p);
      for (int pops = int(rng() % 4); pops > 0 && !reference.empty(); --pops) {  // pops between arrivals
        ASSERT_EQ(queue.size(), reference.size());
        EXPECT_EQ(queue.top().part.task_id, reference.top().task_id);
        EXPECT_EQ(queue.top().part.index, reference.top().index);
        EXPECT_EQ(queue.top().task_bytes, task_bytes[reference.top().task_id]);
        queue.pop();
        reference.pop();
      }
    }
    while (!reference.empty()) {
      ASSERT_FALSE(queue.empty());
      EXPECT_EQ(queue.top().part.task_id, reference.top().task_id);
      EXPECT_EQ(queue.top().part.index, reference.top().index);
      queue.pop();
      reference.pop();
    }
    EXPECT_TRUE(queue.empty());
    EXPECT_EQ(queue.size(), 0u);
  }
}

TEST(PartQueue, TaskBytesTravelWithEachPartition) {
  PartQueue queue;
  const std::vector<PartRef> big = {{1, 0, 2, 1, 0, 10}, {1, 1, 2, 1, 10, 10}};
  const std::vector<PartRef> urgent = {{2, 0, 0, 2, 0, 4}};
  queue.push(big, 20);
  queue.push(urgent, 4);
  EXPECT_EQ(queue.top().task_bytes, 4u);
  queue.pop();
  EXPECT_EQ(queue.top().task_bytes, 20u);
  EXPECT_EQ(queue.top().part.offset, 0u);
  queue.pop();
  EXPECT_EQ(queue.top().part.offset, 10u);
}

}  // namespace
}  // namespace commsched
