// The engine's inside (scheduler/engine.h), shared by its two files: engine.cc (the public calls, admission of a task,
// the producer side that partitions and posts) and engine_loop.cc (the serial scheduler node: events in, the policy
// driven, batches out through the stages to the backend's gateway, completions back). Not part of the interface.
#pragma once

#include <oneapi/tbb/concurrent_queue.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/engine.h"
#include "scheduler/engine_graph.h"
#include "scheduler/engine_tasks.h"
#include "scheduler/engine_timer.h"
#include "scheduler/policy_driver.h"
#include "scheduler/timeline.h"

namespace commsched {

struct Engine::Impl final : DispatchSink {
  // What the scheduler node is told, from any thread.
  struct Event {
    enum class Kind : uint8_t { arrived, batch_sent, batch_done, backward_done, flush, tick, knobs, shutdown };
    Kind kind = Kind::tick;
    TaskState* task = nullptr;  // arrived: ownership passes to the scheduler node
    uint64_t id = 0;            // batch_sent/batch_done: batch id; backward_done/flush: tasks submitted before it
    Status status;
    Knobs knobs;                // knobs
  };

  struct InflightBatch {
    Batch parts;
    std::unique_ptr<Flight> flight;
    Nanos dispatched = 0;
    bool released = false;  // the policy has been told (on `sent`, for backends that report it)
  };

  Impl(std::unique_ptr<Policy> p, std::shared_ptr<CommBackend> b, EngineConfig c,
       std::vector<std::shared_ptr<Stage>> extra);

  Nanos now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }

  // ---------------------------------------------------------------- producer side (any thread; engine.cc)
  void post(Event&& e) {
    events.push(std::move(e));
    graph.kick();
  }
  void post_done(uint64_t id, const Status& s);
  void partition_and_post(TaskState* t);

  // ---------------------------------------------------------------- scheduler node (serial; engine_loop.cc)
  static const char* event_name(Event::Kind k);  // for the message of a fault while handling it
  void run_scheduler();
  void handle(Event& e);
  // Runs scheduler work; an exception from it (a policy's, or the engine's own) means the scheduling state can no
  // longer be trusted: the engine stops scheduling and fails what is pending, naming the cause.
  template <class F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const PolicyFault& ex) {
      break_engine(ex.what());
    } catch (const std::exception& ex) {
      break_engine(std::string("internal error in the engine's scheduler while handling ") + what + ": " + ex.what());
    } catch (...) {
      break_engine(std::string("internal error in the engine's scheduler while handling ") + what);
    }
  }
  // The knobs go to the policy, wherever it runs: here, or in the global order, whose Policy::set_knobs they reach
  // whole. The partition size is the engine's own (active_partition_bytes).
  void apply_knobs(const Knobs& k);
  void on_arrived(TaskState* t);
  // A backward_done (or flush) mark covers the tasks submitted before it; it reaches the policy only after they all
  // arrived, even when big tasks were still being partitioned on another thread.
  void deliver_backward_marks();
  // An iteration mark for the global order: it travels the batches' way (the sequencer keeps it behind them) and the
  // gateway hands it over (start()), so it follows every partition it covers into the backend.
  void emit_mark(Flight::Mark m);
  void pump();
  // DispatchSink: the policy's batch becomes a flight on its way through the stages to the backend's gateway.
  bool dispatch(Batch& batch, Nanos at) override;
  // Gateway body (any graph thread): hands the flight to the backend. A closing engine or a throwing backend
  // completes it with an error instead.
  void start(Flight* f, std::function<void(const Status&)> done);
  // The batch has left this worker: its bytes no longer count against the credit, although its result is pending.
  void on_batch_sent(uint64_t id);
  void on_batch_done(uint64_t id, const Status& s);
  void finish_live(std::unordered_map<uint64_t, std::unique_ptr<TaskState>>::iterator it);
  void finish(std::unique_ptr<TaskState> t);
  Status callback_failure(const std::string& task, const std::string& what);
  // The policy (or the scheduler itself) failed: nothing more is dispatched. Tasks with nothing in flight fail now;
  // the others when their batches come back (their views point into the tasks); later tasks fail on arrival.
  void break_engine(const std::string& why);
  void fail_everything();

  // ---------------------------------------------------------------- state
  std::unique_ptr<Policy> policy;  // ForwardPolicy where the global order runs the engine's own (local_policy)
  PolicyDriver driver;  // the one loop that drives the policy (scheduler/policy_driver.h)
  std::shared_ptr<CommBackend> backend;
  EngineConfig config;
  const bool splits;
  const BackendCapabilities caps;  // asked once: reports_sent (credit is released on `sent`), global_order, joins
  const std::chrono::steady_clock::time_point t0;
  std::unique_ptr<Timeline> timeline;
  tbb::concurrent_queue<Event> events;  // before the graph: its threads post events from the start

  // Scheduler-node state: touched only by run_scheduler().
  std::unordered_map<uint64_t, std::unique_ptr<TaskState>> live;
  std::unordered_map<uint64_t, InflightBatch> batches;
  struct Mark {
    uint64_t tasks;  // submitted before the mark
    bool flush;      // Engine::flush rather than backward_done
  };
  std::deque<Mark> backward_marks;
  uint64_t arrived_tasks = 0;
  uint64_t next_batch_id = 1;
  uint64_t next_span_id = 1;
  bool stopped = false;
  std::string fault;  // why the engine stopped scheduling (empty: it did not)

  // Submit-side state.
  TaskRegistry registry;
  TaskPool tasks;  // finished TaskStates, reused by submit (scheduler/engine_tasks.h says why)
  WaitGroup waits;
  std::atomic<uint64_t> iteration{0};
  std::atomic<uint64_t> active_partition_bytes{0};
  mutable std::mutex knobs_mu;
  Knobs pending_knobs;
  std::mutex marks_mu;  // orders task ids and backward/flush marks
  std::atomic<bool> closed{false};
  std::atomic<bool> shutdown_done{false};
  std::mutex shutdown_mu;
  bool shut_down = false;  // under shutdown_mu

  std::atomic<uint64_t> stat_submitted{0}, stat_completed{0}, stat_failed{0}, stat_partitions{0}, stat_batches{0},
      stat_bytes{0}, stat_wire_bytes{0};

  EngineGraph graph;  // last but one: destroyed (driver stopped, graph drained) before the state above
  WakeupTimer timer;  // last: its thread posts events
};

}  // namespace commsched
