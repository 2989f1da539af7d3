// The engine's oneTBB flow graph: typed nodes joined by make_edge.
//
//   submit ─► partition (multifunction, unlimited) ─kick─┐
//                                                        ▼
//        ┌────────────────────────────────────── scheduler (multifunction, serial: owns the Policy)
//        │ staged flights                           │ port 1: flights no stage applies to
//        ▼                                          ▼
//   encode[0] ─► … ─► encode[n-1] ─────────────► sequencer (dispatch order) ─► gateway (async_node, serial)
//                                                   │     └─► CommBackend::start(batch, sent, done)
//                                                   │ done(status), any thread, exactly once
//   decode[0] ◄─ … ◄─ decode[n-1] ◄── staged ───────┘ (unstaged: straight to the completion queue)
//        │
//        ▼
//   completion (multifunction, unlimited) ─kick─► scheduler
//
// Events (arrivals, completions, timer ticks) reach the serial scheduler through a concurrent queue, and the edges
// carry "kicks": a burst of events costs one scheduler execution, not one message each, which keeps the engine under
// a microsecond per partition. Each stage node has its stage's concurrency; credit is consumed at dispatch, so it
// gates what enters the chain. Stages of different partitions overlap and may finish out of order; the sequencer
// puts the batches back in the order the policy dispatched them, and the serial gateway starts them one at a time, as
// the backend expects (a collective needs the same order on every rank). Node bodies never throw: a stage's
// exception fails its batch with the stage's name.
//
// The graph's tasks must run even where oneTBB has no worker thread (one CPU, or a cgroup of one): a driver thread
// delivers kicks from outside the graph and waits for the graph, which executes whatever is pending.
#pragma once

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "scheduler/stage.h"
#include "scheduler/task.h"

namespace commsched {

struct TaskState;

// A batch between dispatch and the scheduler's handling of its completion. Owned by the scheduler node's table.
struct Flight {
  uint64_t id = 0;
  uint64_t seq = 0;                  // message order, dense from 0 (the sequencer's key; set by EngineGraph)
  Flight* next = nullptr;            // unstaged flights of one scheduler run travel as one message, in order
  std::vector<PartitionView> views;  // what the backend gets (rewritten by stages)
  // Per partition, when stages apply: the view each stage got (task == null: the stage did not apply) and its state.
  struct Staged {
    const TaskDesc* task = nullptr;      // the partition's own task (stages judge by it, not by a wire view)
    std::vector<PartitionView> inputs;
    std::vector<std::unique_ptr<StageState>> states;
  };
  std::vector<Staged> staged;  // empty: no stage applies to this batch
  Status status;               // a stage's or the backend's failure
  // An iteration mark on its way to the global order (BackendCapabilities::global_order): no views; the gateway hands
  // it over after starting every batch dispatched before it.
  enum class Mark : uint8_t { none, backward, flush };
  Mark mark = Mark::none;
  std::atomic<bool> completed{false};
};

class EngineGraph {
 public:
  using Kick = tbb::flow::continue_msg;
  struct Hooks {
    std::function<void(TaskState*)> partition;               // partition node body (posts the arrival)
    std::function<void()> schedule;                           // the serial scheduler body; dispatches via emit()
    std::function<void(Flight*, std::function<void(const Status&)>)> start;  // hands a flight to the backend
    std::function<void(Flight*)> completed;                   // posts the completion for the scheduler
  };

  EngineGraph(Hooks hooks, std::vector<std::shared_ptr<Stage>> stages);
  ~EngineGraph();
  EngineGraph(const EngineGraph&) = delete;
  EngineGraph& operator=(const EngineGraph&) = delete;

  // Any thread: make sure the scheduler runs soon (coalesced: at most one kick pending).
  void kick();
  // Scheduler body: called first in each drain round, so events posted from now on kick again.
  void begin_drain() { kick_pending_.store(false, std::memory_order_release); }
  // Scheduler body: sends a dispatched flight on (through the stages if f->staged is not empty). Flights no stage
  // applies to are grouped into one message per scheduler run (one gateway task for many small batches).
  void emit(Flight* f);
  // Any thread: queues a big task on the parallel partition node.
  void partition(TaskState* t);

  // Blocks until the graph has no work left (what is in the backend is not the graph's work).
  void wait_idle() { graph_.wait_for_all(); }
  // Stops the driver thread (after the engine's last kick was delivered).
  void stop_driver();

  const std::vector<std::shared_ptr<Stage>>& stages() const { return stages_; }

 private:
  using FlightNode = tbb::flow::multifunction_node<Flight*, std::tuple<Flight*>>;
  void build_stage_nodes();
  void send_group();  // scheduler body: the pending unstaged flights, as one message
  void encode_with(size_t k, Flight* f);
  void decode_with(size_t k, Flight* f);
  void on_backend_done(Flight* f, const Status& s);
  void request_drive(bool kick);
  void drive_loop();

  // The graph lives in an arena of its own. A graph that makes its own implicit arena got no worker thread when an
  // earlier engine of the same process had come and gone (oneTBB 2021): its stages then ran one at a time.
  struct ArenaGraph {
    tbb::task_arena arena;
    std::unique_ptr<tbb::flow::graph> graph;
    ArenaGraph() {
      arena.initialize();
      arena.execute([&] { graph = std::make_unique<tbb::flow::graph>(); });
    }
  };

  Hooks hooks_;
  std::vector<std::shared_ptr<Stage>> stages_;
  ArenaGraph arena_graph_;
  tbb::flow::graph& graph_;
  tbb::flow::multifunction_node<TaskState*, std::tuple<Kick>> partition_node_;
  tbb::flow::multifunction_node<Kick, std::tuple<Flight*, Flight*>> sched_node_;
  tbb::flow::sequencer_node<Flight*> sequencer_;
  tbb::flow::async_node<Flight*, Flight*> gateway_;
  tbb::flow::multifunction_node<Flight*, std::tuple<Kick>> completion_node_;
  std::vector<std::unique_ptr<FlightNode>> encode_nodes_, decode_nodes_;
  tbb::flow::multifunction_node<Kick, std::tuple<Flight*, Flight*>>::output_ports_type* sched_ports_ = nullptr;
  std::atomic<bool> kick_pending_{false};
  uint64_t next_seq_ = 0;                            // scheduler body only
  Flight* group_head_ = nullptr, *group_tail_ = nullptr;  // scheduler body only

  std::mutex drive_mu_;
  std::condition_variable drive_cv_;
  uint64_t kicks_requested_ = 0;
  bool drive_requested_ = false;
  bool drive_stop_ = false;
  std::thread drive_thread_;
};

}  // namespace commsched
