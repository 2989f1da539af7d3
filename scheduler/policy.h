// Policy: decides which partitions to dispatch next. Pure, deterministic and single-threaded: no clocks, no threads,
// no I/O inside. The engine (real time) and the simulator (simulated time) drive the very same Policy objects by
// telling them events and asking poll() what to dispatch now.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

namespace commsched {

// A partition as a policy sees it: identifiers and sizes only, no data.
struct PartRef {
  uint64_t task_id = 0;    // engine-unique task id (increasing in arrival order)
  uint32_t index = 0;      // partition index within the task
  int32_t priority = 0;    // the task's priority; lower is more urgent
  uint64_t seq = 0;        // the task's arrival sequence number (tie-break after priority)
  uint64_t offset = 0;     // byte offset within the task
  uint64_t bytes = 0;      // byte length
};

// One backend operation. More than one partition means "fuse them into one message/collective".
using Batch = std::vector<PartRef>;

struct TaskArrival {
  uint64_t task_id = 0;
  int32_t priority = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  std::span<const PartRef> parts;  // in offset order; valid only during the call
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;

  // Whether the engine should split tasks into partitions of the configured size. Whole-tensor baselines say false
  // and receive one partition per task.
  virtual bool splits_tasks() const { return true; }

  // Events.
  virtual void on_task_arrived(const TaskArrival& task, Nanos now) = 0;
  // The batch no longer occupies this worker's link: it completed, or (for backends that report it) it has been
  // sent and the receiver holds it while its result is still pending. Credit is released here.
  virtual void on_batch_done(const Batch& batch, Nanos now) = 0;
  // The framework has produced every gradient of the current iteration (end of backward).
  virtual void on_backward_done(Nanos /*now*/) {}
  // The tasks told so far are not part of a backward (a parameter broadcast, a metric all-reduce) and must not wait
  // for one: a policy that holds tasks until on_backward_done releases them here, and one that learns from the
  // backward does not learn from them. Not the end of an iteration.
  virtual void on_flush(Nanos /*now*/) {}

  // Knobs; applied by the caller at an iteration boundary (credit_bytes == 0 means "no limit"). The one way knobs
  // reach a policy, wherever it runs (an engine, rank 0's coordinator of a collective, the simulator): a policy is
  // handed the whole knob set and takes what it uses.
  virtual void set_knobs(const Knobs& /*k*/) {}
  // Told once, before any event, when this policy orders a collective for every rank (rank 0's global order,
  // scheduler/global_order.h): its credit is then the one global credit, which cannot deadlock the way per-worker
  // credits can, so a guard against that deadlock is off.
  virtual void on_global_order() {}

  // Appends what to dispatch now (possibly nothing). Called after every event and at wake-ups.
  virtual void poll(Nanos now, std::vector<Batch>& out) = 0;
  // The earliest time poll() must be called again even if no event arrives (a fusion cycle, say); nullopt: none.
  virtual std::optional<Nanos> next_wakeup() const { return std::nullopt; }

  // Partitions told but not yet dispatched, and bytes dispatched but not yet done.
  virtual size_t queued_partitions() const = 0;
  virtual uint64_t bytes_in_flight() const = 0;
};

// What the tuner drives: anything whose partition size and credit can be changed at an iteration boundary.
class KnobControl {
 public:
  virtual ~KnobControl() = default;
  virtual Knobs knobs() const = 0;
  // Takes effect at the next iteration boundary (Engine: next backward_done()).
  virtual void set_knobs(const Knobs& k) = 0;
};

}  // namespace commsched
