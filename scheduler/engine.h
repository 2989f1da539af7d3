// Engine: the scheduling core. Framework threads submit tasks and wait; a oneTBB flow graph (scheduler/engine_graph.h)
// partitions them (in parallel for big tasks), one serial node owns the Policy and dispatches batches through a chain
// of stage nodes (compression, ...) to the CommBackend's async gateway, and completions come back along edges into
// the serial node. The pieces: engine.cc (these calls, admission of a task), engine_loop.cc (the serial node's work),
// engine_impl.h (the state they share), engine_tasks (task table), engine_graph (nodes and edges), engine_timer
// (policy wake-ups), engine_trace (timeline records).
//
// An exception anywhere inside (policy, backend, stage, callback) never leaves a task unfinished: a stage's or the
// backend's fails its batch; a policy's stops scheduling for good and fails every pending and later task with a
// message naming the policy and the event; a callback's is reported by wait_all().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "comm_backends/comm_backend.h"
#include "scheduler/config.h"
#include "scheduler/policy.h"
#include "scheduler/stage.h"
#include "scheduler/task.h"

namespace commsched {

class Timeline;

struct EngineStats {
  uint64_t tasks_submitted = 0;
  uint64_t tasks_completed = 0;
  uint64_t tasks_failed = 0;
  uint64_t partitions_dispatched = 0;
  uint64_t batches_dispatched = 0;
  uint64_t bytes_dispatched = 0;
  uint64_t iteration = 0;
  uint64_t wire_bytes = 0;  // bytes handed to the backend after the stages (compressed), for dispatched batches
};

class Engine final : public KnobControl {
 public:
  // The engine shares ownership of the backend and shuts it down in shutdown(). `config.knobs` gives the initial
  // partition size and credit; `config.timeline_path` (if set) receives a Chrome trace for this rank;
  // `config.compression` is the default compression of reduce tasks. `extra_stages` run after the compression stage
  // (encode in this order, decode in reverse), except memory stages (Stage::Placement::memory: a device-to-host copy),
  // which run before it.
  Engine(std::unique_ptr<Policy> policy, std::shared_ptr<CommBackend> backend, EngineConfig config = {},
         std::vector<std::shared_ptr<Stage>> extra_stages = {});
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Validates the task (InvalidArgument naming it: null buffer, unknown dtype, duplicate name in flight,
  // an operation the backend cannot carry on the device the stages hand it) and queues it. Returns the engine task id. The task's callback runs exactly
  // once, on the scheduler thread, after all its partitions completed; keep it short.
  uint64_t submit(Task task);

  // Marks the end of backward for the current iteration: the iteration counter advances, knob changes requested by
  // set_knobs() take effect for tasks submitted from now on, and policies that wait for backward (BSP) are told.
  void backward_done();

  // Releases the tasks submitted so far that are not part of a backward (a parameter broadcast, a metric all-reduce):
  // policies that hold tasks until backward_done() (BSP, MG-WFBP) send them now, and MG-WFBP does not learn its merge
  // plan from them. Unlike backward_done(), the iteration does not advance and pending knob changes wait.
  void flush();

  // Blocks until every submitted task has completed (successfully or not). Returns the first failure since the
  // previous wait_all (a task's error, or a callback that threw), ok if there was none.
  Status wait_all();
  // As wait_all, but gives up after `timeout`; returns whether everything completed.
  bool wait_all_for(std::chrono::nanoseconds timeout);

  // Horovod's join, on a backend whose capabilities say joins (InvalidArgument otherwise): flushes, waits for every task of
  // this rank (throws std::runtime_error with the first failure), then blocks until every rank has joined while the
  // backend stands in with zeros for the reductions the others still run. Returns the rank that joined last. Every
  // name's round starts again from 0 afterwards, on every rank alike, so ranks that ran different numbers of
  // iterations line up again. Do not submit from other threads meanwhile.
  int join();

  // Stops accepting tasks, shuts the backend down and fails every task still pending with a 'cancelled' status.
  // Idempotent; the destructor calls it.
  void shutdown();

  // KnobControl: the change applies at the next backward_done().
  Knobs knobs() const override;
  void set_knobs(const Knobs& k) override;

  EngineStats stats() const;
  uint64_t iteration() const;
  std::string_view policy_name() const;
  CommBackend& backend() const;
  // What a waiter for this engine's tasks lends its thread to (BackendCapabilities::wait_helper, for
  // CompletionWaiter::wait) and, beside it, the backend that owns it, to be locked while helping: a waiter may outlive
  // the engine. Null when the backend has no helper.
  struct Helper {
    WaitHelper* helper = nullptr;
    std::weak_ptr<CommBackend> owner;
  };
  Helper wait_helper() const;
  // Nanoseconds since the engine started (the clock of its Policy and timeline).
  Nanos now() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace commsched
