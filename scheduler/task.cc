#include "scheduler/task.h"

#include <limits>

namespace commsched {

uint64_t task_key(std::string_view name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

uint64_t partition_stride(DType dtype, uint64_t partition_bytes) {
  const uint64_t esz = dtype_size(dtype);
  if (partition_bytes == 0) return std::numeric_limits<uint64_t>::max();
  const uint64_t whole = partition_bytes / esz * esz;
  return whole == 0 ? esz : whole;
}

uint32_t partition_count(uint64_t count, DType dtype, uint64_t partition_bytes) {
  const uint64_t total = count * dtype_size(dtype);
  if (total == 0) return 0;
  const uint64_t p = partition_stride(dtype, partition_bytes);
  return static_cast<uint32_t>(total / p + (total % p != 0));
}

std::vector<ByteRange> partition_ranges(uint64_t count, DType dtype, uint64_t partition_bytes) {
  std::vector<ByteRange> out;
  out.reserve(partition_count(count, dtype, partition_bytes));
  for_each_partition(count, dtype, partition_bytes, [&](uint32_t, ByteRange r) { out.push_back(r); });
  return out;
}

void validate_task(const Task& t) {
  auto who = [&] { return "task '" + t.name + "'"; };  // built only for an error: this runs on every submit
  if (t.name.empty()) throw InvalidArgument("task name must not be empty");
  if (!is_valid_dtype(static_cast<uint8_t>(t.dtype)))
    throw InvalidArgument(who() + ": unknown dtype value " + std::to_string(static_cast<int>(t.dtype)));
  if (static_cast<uint8_t>(t.op) > static_cast<uint8_t>(Op::broadcast))
    throw InvalidArgument(who() + ": unknown operation value " + std::to_string(static_cast<int>(t.op)));
  if (t.count > 0 && t.buffer.data == nullptr) throw InvalidArgument(who() + ": null buffer for " + std::to_string(t.count) + " elements");
  if (t.count > std::numeric_limits<uint64_t>::max() / 8) throw InvalidArgument(who() + ": element count " + std::to_string(t.count) + " too large");
  if (t.root < 0) throw InvalidArgument(who() + ": negative broadcast root " + std::to_string(t.root));
}

}  // namespace commsched
