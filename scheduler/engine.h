// Engine: the scheduling core. Framework threads submit tasks and wait; a oneTBB flow graph partitions them (in
// parallel for big tasks), one serial node owns the Policy and dispatches batches to a CommBackend, and completions
// from backend threads flow back into that same serial node.
//
//   submit(Task) ──► [partition: function_node, unlimited] ──► event queue ──► [scheduler: function_node, serial]
//                                                                  ▲                 │ Policy::poll → start()
//       backend threads: done(status) ─────────────────────────────┘                 ▼
//                                                                              CommBackend
//
// Events reach the serial node through a concurrent queue plus a "kick" message, so a burst of completions costs one
// node execution rather than one flow-graph message each. That keeps the engine under a microsecond per partition.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "comm_backends/comm_backend.h"
#include "scheduler/config.h"
#include "scheduler/policy.h"
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
};

class Engine final : public KnobControl {
 public:
  // The engine shares ownership of the backend and shuts it down in shutdown(). `config.knobs` gives the initial
  // partition size and credit; `config.timeline_path` (if set) receives a Chrome trace for this rank.
  Engine(std::unique_ptr<Policy> policy, std::shared_ptr<CommBackend> backend, EngineConfig config = {});
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Validates the task (InvalidArgument naming it: null buffer, unknown dtype, duplicate name in flight,
  // an operation the backend cannot carry) and queues it. Returns the engine task id. The task's callback runs exactly
  // once, on the scheduler thread, after all its partitions completed; keep it short.
  uint64_t submit(Task task);

  // Marks the end of backward for the current iteration: the iteration counter advances, knob changes requested by
  // set_knobs() take effect for tasks submitted from now on, and policies that wait for backward (BSP) are told.
  void backward_done();

  // Releases the tasks submitted so far that are not part of a backward (a parameter broadcast, a metric all-reduce):
  // policies that hold tasks until backward_done() (BSP, MG-WFBP) send them now, and MG-WFBP does not learn its merge
  // plan from them. Unlike backward_done(), the iteration does not advance and pending knob changes wait.
  void flush();

  // Blocks until every submitted task has completed (successfully or not).
  void wait_all();
  // As wait_all, but gives up after `timeout`; returns whether everything completed.
  bool wait_all_for(std::chrono::nanoseconds timeout);

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
  // Nanoseconds since the engine started (the clock of its Policy and timeline).
  Nanos now() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace commsched
