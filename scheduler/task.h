// A Task is one tensor's communication for one iteration; a PartitionView is a contiguous byte range of it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "base/types.h"

namespace commsched {

// Called exactly once per submitted task, after every partition has finished (or the engine shut down).
using TaskCallback = std::function<void(const Status&)>;

// What the framework submits.
struct Task {
  std::string name;              // unique among tasks in flight; stable across iterations and ranks
  int32_t priority = 0;          // layer index in forward order; lower is more urgent
  Op op = Op::push_pull;
  DType dtype = DType::f32;
  uint64_t count = 0;            // number of elements
  Buffer buffer;                 // in/out: the result (sum, broadcast value) is written back in place
  int root = 0;                  // broadcast source rank
  TaskCallback on_done;          // may be empty
  // Gradient compression for this task; unset: the engine's configured default. Broadcasts and integer tensors
  // are never compressed.
  std::optional<compression::Spec> compression;

  uint64_t bytes() const { return count * dtype_size(dtype); }
};

// Stable 64-bit key of a task name (FNV-1a). Equal on every rank and every run; backends use it on the wire.
uint64_t task_key(std::string_view name);

// The engine's record of a submitted task, shared read-only with policies' callers and backends.
// It stays valid until every partition of the task has completed.
struct TaskDesc {
  uint64_t id = 0;               // engine-unique, increasing
  uint64_t key = 0;              // task_key(name)
  std::string name;
  int32_t priority = 0;
  Op op = Op::push_pull;
  DType dtype = DType::f32;
  uint64_t count = 0;
  Buffer buffer;
  int root = 0;
  uint64_t iteration = 0;        // engine iteration (advanced by Engine::backward_done)
  uint64_t round = 0;            // how many tasks with this name were submitted before this one
  uint32_t num_partitions = 0;
  compression::Spec compression;  // resolved at submit: none for broadcasts and integer tensors

  uint64_t bytes() const { return count * dtype_size(dtype); }
};

// A partition as a backend sees it: a view into the task's buffer, never a copy.
struct PartitionView {
  const TaskDesc* task = nullptr;
  uint32_t index = 0;            // index among the task's partitions
  uint64_t offset = 0;           // bytes from the start of the task's buffer; a multiple of the element size
  uint64_t bytes = 0;            // a multiple of the element size
  // Set by a stage (an encoder): the partition's bytes live in the stage's buffer, not in the task's buffer.
  std::byte* payload = nullptr;
  // Set by an encoder whose wire is not a sequence of elements (top-k, signSGD): the range's bytes before encoding.
  // 0 otherwise. A backend that sums such a range must decode it (CommBackend::reduces_encoded), never cut it.
  uint64_t dense_bytes = 0;

  std::byte* data() const { return payload ? payload : static_cast<std::byte*>(task->buffer.data) + offset; }
  uint64_t elements() const { return bytes / dtype_size(task->dtype); }
  uint64_t first_element() const { return offset / dtype_size(task->dtype); }
};

// Byte ranges [offset, offset+bytes) covering a tensor of `count` elements of `dtype` exactly once, each at most
// `partition_bytes` long (rounded down to whole elements, at least one element). partition_bytes == 0 means "do not
// split": one range for the whole tensor. A tensor of 0 elements has no ranges.
struct ByteRange {
  uint64_t offset;
  uint64_t bytes;
};
// The longest range partition_ranges cuts: partition_bytes rounded down to whole elements, at least one element;
// unlimited for 0.
uint64_t partition_stride(DType dtype, uint64_t partition_bytes);
// Calls f(index, range) for each of partition_ranges' ranges in order, without building the list: the engine fills
// a task's partitions with it (one allocation fewer per task).
template <class F>
void for_each_partition(uint64_t count, DType dtype, uint64_t partition_bytes, F&& f) {
  const uint64_t total = count * dtype_size(dtype);
  const uint64_t p = partition_stride(dtype, partition_bytes);
  uint32_t i = 0;
  for (uint64_t off = 0; off < total; off += p) f(i++, ByteRange{off, std::min(p, total - off)});
}
std::vector<ByteRange> partition_ranges(uint64_t count, DType dtype, uint64_t partition_bytes);
// Number of ranges partition_ranges would produce, without allocating.
uint32_t partition_count(uint64_t count, DType dtype, uint64_t partition_bytes);
// Validates a task at the API boundary; throws InvalidArgument naming the task and the problem.
void validate_task(const Task& t);

}  // namespace commsched
