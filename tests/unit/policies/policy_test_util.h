// Helpers shared by the baseline policy tests: tell a policy whole-tensor tasks and collect what it dispatches.
#pragma once

#include <vector>

#include "scheduler/policy.h"

namespace commsched::testing {

// Tells `policy` a whole-tensor task (one partition) and returns what poll() dispatches right after.
inline std::vector<Batch> arrive(Policy& policy, uint64_t id, int32_t priority, uint64_t bytes, Nanos now) {
  PartRef part{id, 0, priority, id, 0, bytes};
  TaskArrival arrival{id, priority, id, bytes, std::span<const PartRef>(&part, 1)};
  policy.on_task_arrived(arrival, now);
  std::vector<Batch> out;
  policy.poll(now, out);
  return out;
}

inline std::vector<Batch> poll_at(Policy& policy, Nanos now) {
  std::vector<Batch> out;
  policy.poll(now, out);
  return out;
}

inline uint64_t batch_bytes(const Batch& b) {
  uint64_t n = 0;
  for (const PartRef& p : b) n += p.bytes;
  return n;
}

}  // namespace commsched::testing
