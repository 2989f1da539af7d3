// What the engine writes to its timeline: one span per batch (dispatch to completion) and, per task, the time it
// queued and the time it communicated. Formatting only; the Timeline owns the file.
#pragma once

#include <string_view>
#include <vector>

#include "comm_backends/comm_backend.h"

#include "scheduler/policy.h"
#include "scheduler/task.h"
#include "scheduler/timeline.h"

namespace commsched {

// `first_task` names the batch (null when that task is already gone: "?").
void trace_batch(Timeline& tl, uint64_t span_id, const Batch& parts, const TaskDesc* first_task, Nanos dispatched,
                 Nanos done, bool ok);
void trace_task(Timeline& tl, uint64_t& next_span_id, const TaskDesc& task, Nanos submitted, Nanos first_dispatch,
                Nanos done);
void trace_backward_done(Timeline& tl, Nanos at, uint64_t iteration, const Knobs& k);
// The ranks the backend says lag (CommBackend::stragglers), one instant per iteration while there are any:
// {"lagging":[{"rank":3,"iterations":2,"seconds":0.41}, ...]}.
void trace_stragglers(Timeline& tl, Nanos at, const std::vector<Straggler>& lagging);

}  // namespace commsched
