#include "scheduler/engine_trace.h"

#include <cstdio>
#include <string>

namespace commsched {

void trace_batch(Timeline& tl, uint64_t span_id, const Batch& parts, const TaskDesc* first_task, Nanos dispatched,
                 Nanos done, bool ok) {
  std::string name = first_task ? first_task->name : "?";
  name += "[" + std::to_string(parts.front().index) + "]";
  if (parts.size() > 1) name += "+" + std::to_string(parts.size() - 1);
  uint64_t bytes = 0;
  for (const PartRef& p : parts) bytes += p.bytes;
  const std::string args = "{\"bytes\":" + std::to_string(bytes) + ",\"partitions\":" + std::to_string(parts.size()) +
                           ",\"ok\":" + (ok ? "true" : "false") + "}";
  tl.span("partition", name, span_id, dispatched, done, args);
}

void trace_task(Timeline& tl, uint64_t& next_span_id, const TaskDesc& task, Nanos submitted, Nanos first_dispatch,
                Nanos done) {
  const Nanos start = first_dispatch >= 0 ? first_dispatch : done;
  std::string args = "{\"bytes\":" + std::to_string(task.bytes()) + ",\"priority\":" + std::to_string(task.priority) +
                     ",\"iteration\":" + std::to_string(task.iteration);
  if (task.compression.scheme != compression::Scheme::none)
    args += ",\"compression\":\"" + compression::to_string(task.compression) + "\"";
  args += "}";
  tl.span("queued", task.name, next_span_id++, submitted, start, args);
  tl.span("communicating", task.name, next_span_id++, start, done, args);
}

void trace_backward_done(Timeline& tl, Nanos at, uint64_t iteration, const Knobs& k) {
  tl.instant("backward_done", at,
             "{\"iteration\":" + std::to_string(iteration) + ",\"partition_bytes\":" + std::to_string(k.partition_bytes) +
                 ",\"credit_bytes\":" + std::to_string(k.credit_bytes) + "}");
  tl.flush();
}

void trace_stragglers(Timeline& tl, Nanos at, const std::vector<Straggler>& lagging) {
  if (lagging.empty()) return;
  std::string args = "{\"lagging\":[";
  char entry[128];
  for (size_t i = 0; i < lagging.size(); ++i) {
    std::snprintf(entry, sizeof entry, "%s{\"rank\":%d,\"iterations\":%llu,\"seconds\":%.3f}", i ? "," : "",
                  lagging[i].rank, static_cast<unsigned long long>(lagging[i].iterations), lagging[i].seconds);
    args += entry;
  }
  tl.instant("stragglers", at, args + "]}");
}

}  // namespace commsched
