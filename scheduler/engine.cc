#include "scheduler/engine.h"

#include <oneapi/tbb/concurrent_queue.h>

#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "scheduler/engine_graph.h"
#include "scheduler/engine_tasks.h"
#include "scheduler/engine_timer.h"
#include "scheduler/engine_trace.h"
#include "scheduler/forward_policy.h"
#include "scheduler/global_order.h"
#include "scheduler/policy_driver.h"
#include "scheduler/stages/compression_stage.h"
#include "scheduler/timeline.h"

namespace commsched {
namespace {

// Tasks with more partitions than this are partitioned on the flow graph's parallel node instead of inline.
constexpr uint32_t kInlinePartitionLimit = 64;

struct Event {
  enum class Kind : uint8_t { arrived, batch_sent, batch_done, backward_done, flush, tick, knobs, shutdown };
  Kind kind = Kind::tick;
  TaskState* task = nullptr;  // arrived: ownership passes to the scheduler node
  uint64_t id = 0;            // batch_sent/batch_done: batch id; backward_done/flush: tasks submitted before it
  Status status;
  Knobs knobs;                // knobs
};

const char* event_name(Event::Kind k) {
  switch (k) {
    case Event::Kind::arrived: return "a task arrival";
    case Event::Kind::batch_sent: return "a batch-sent notice";
    case Event::Kind::batch_done: return "a batch completion";
    case Event::Kind::backward_done: return "the end of backward";
    case Event::Kind::flush: return "a flush";
    case Event::Kind::tick: return "a wake-up";
    case Event::Kind::knobs: return "a knob change";
    case Event::Kind::shutdown: return "shutdown";
  }
  return "an event";
}

struct InflightBatch {
  Batch parts;
  std::unique_ptr<Flight> flight;
  Nanos dispatched = 0;
  bool released = false;  // the policy has been told (on `sent`, for backends that report it)
};

// Memory stages (device copies) first, so the compression stage finds the bytes on the host; then the others.
std::vector<std::shared_ptr<Stage>> engine_stages(std::vector<std::shared_ptr<Stage>> extra) {
  std::vector<std::shared_ptr<Stage>> all;
  for (auto& s : extra)
    if (s && s->placement() == Stage::Placement::memory) all.push_back(s);
  all.push_back(std::make_shared<CompressionStage>());
  for (auto& s : extra)
    if (s && s->placement() != Stage::Placement::memory) all.push_back(std::move(s));
  return all;
}

// Over a backend whose order is decided on rank 0 over every rank's readiness, the engine's own policy goes there
// (the global order runs it, told every rank's iteration marks) and the engine forwards what arrives
// (scheduler/forward_policy.h).
std::unique_ptr<Policy> local_policy(std::unique_ptr<Policy> policy, const BackendCapabilities& caps) {
  if (!caps.global_order) return policy;
  auto forward = std::make_unique<ForwardPolicy>(std::string(policy->name()), policy->splits_tasks());
  caps.global_order->adopt(std::move(policy), /*marks=*/true);
  return forward;
}

}  // namespace

struct Engine::Impl final : DispatchSink {
  Impl(std::unique_ptr<Policy> p, std::shared_ptr<CommBackend> b, EngineConfig c, std::vector<std::shared_ptr<Stage>> extra)
      : policy(local_policy(std::move(p), b->capabilities())),
        driver(*policy),
        backend(std::move(b)),
        config(std::move(c)),
        splits(policy->splits_tasks()),
        caps(backend->capabilities()),
        t0(std::chrono::steady_clock::now()),
        graph(EngineGraph::Hooks{[this](TaskState* t) { partition_and_post(t); }, [this] { run_scheduler(); },
                                 [this](Flight* f, std::function<void(const Status&)> done) { start(f, std::move(done)); },
                                 [this](Flight* f) { post_done(f->id, f->status); }},
              engine_stages(std::move(extra))),
        timer(t0, [this] {
          Event e;
          e.kind = Event::Kind::tick;
          post(std::move(e));
        }) {
    active_partition_bytes.store(config.knobs.partition_bytes);
    pending_knobs = config.knobs;
    if (caps.global_order) apply_knobs(config.knobs);
    if (!config.timeline_path.empty())
      timeline = std::make_unique<Timeline>(config.timeline_path, backend->rank(), config.timeline_max_events);
  }

  Nanos now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }

  // ---------------------------------------------------------------- producer side (any thread)
  void post(Event&& e) {
    events.push(std::move(e));
    graph.kick();
  }

  void post_done(uint64_t id, const Status& s) {
    Event e;
    e.kind = Event::Kind::batch_done;
    e.id = id;
    e.status = s;
    events.push(std::move(e));
  }

  void partition_and_post(TaskState* t) {
    try {
      const uint64_t pbytes = splits ? active_partition_bytes.load(std::memory_order_relaxed) : 0;
      const uint32_t n = partition_count(t->desc.count, t->desc.dtype, pbytes);
      t->parts.reserve(n);
      for (uint32_t i = 0; i < n; ++i) {
        const ByteRange r = partition_range(t->desc.count, t->desc.dtype, pbytes, i);
        t->parts.push_back(PartRef{t->desc.id, i, t->desc.priority, t->desc.id, r.offset, r.bytes});
      }
    } catch (const std::exception& ex) {
      t->parts.clear();
      t->status = Status::Error("partitioning task '" + t->desc.name + "' failed: " + ex.what());
    }
    t->desc.num_partitions = static_cast<uint32_t>(t->parts.size());
    t->remaining = t->desc.num_partitions;
    Event e;
    e.kind = Event::Kind::arrived;
    e.task = t;
    events.push(std::move(e));
  }

  // ---------------------------------------------------------------- scheduler node (serial)
  void run_scheduler() {
    do {
      graph.begin_drain();
      Event e;
      while (events.try_pop(e)) handle(e);
      // Once shutdown began nothing new is dispatched: what the policy still holds is cancelled with the rest.
      if (!stopped && fault.empty() && !closed.load(std::memory_order_acquire)) guarded("a poll", [&] { pump(); });
    } while (!events.empty());
  }

  void handle(Event& e) {
    guarded(event_name(e.kind), [&] {
      switch (e.kind) {
        case Event::Kind::arrived: on_arrived(e.task); break;
        case Event::Kind::batch_sent: on_batch_sent(e.id); break;
        case Event::Kind::batch_done: on_batch_done(e.id, e.status); break;
        case Event::Kind::backward_done:
        case Event::Kind::flush:
          backward_marks.push_back({e.id, e.kind == Event::Kind::flush});
          deliver_backward_marks();
          break;
        case Event::Kind::tick: break;  // pump() polls the policy
        case Event::Kind::knobs:
          if (!stopped && fault.empty()) apply_knobs(e.knobs);
          break;
        case Event::Kind::shutdown: fail_everything(); break;
      }
    });
  }

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
  void apply_knobs(const Knobs& k) {
    if (caps.global_order) caps.global_order->post(k);
    driver.set_knobs(k);
  }

  void on_arrived(TaskState* t) {
    ++arrived_tasks;
    std::unique_ptr<TaskState> owned(t);
    if (stopped || !fault.empty()) {
      owned->status = stopped ? Status::Error("engine shut down before task '" + t->desc.name + "' was scheduled",
                                              Status::Code::cancelled)
                              : Status::Error("task '" + t->desc.name + "' not scheduled: " + fault);
      finish(std::move(owned));
      deliver_backward_marks();
      return;
    }
    if (t->remaining == 0) {
      finish(std::move(owned));
    } else {
      for (const auto& st : graph.stages()) t->staged = t->staged || st->applies(t->desc);
      const uint64_t id = t->desc.id;
      live.emplace(id, std::move(owned));  // first: a policy that throws here still finds the task to fail
      TaskArrival arrival{t->desc.id, t->desc.priority, t->desc.id, t->desc.bytes(), t->parts};
      driver.arrived(arrival, now());
    }
    deliver_backward_marks();
  }

  // A backward_done (or flush) mark covers the tasks submitted before it; it reaches the policy only after they all
  // arrived, even when big tasks were still being partitioned on another thread.
  void deliver_backward_marks() {
    while (!backward_marks.empty() && arrived_tasks >= backward_marks.front().tasks) {
      const bool flush = backward_marks.front().flush;
      backward_marks.pop_front();
      if (stopped || !fault.empty()) continue;
      if (flush) driver.flushed(now());
      else driver.backward_done(now());
      if (caps.global_order && !closed.load(std::memory_order_acquire)) {
        pump();  // what arrived before the mark goes first
        emit_mark(flush ? Flight::Mark::flush : Flight::Mark::backward);
      }
    }
  }

  // An iteration mark for the global order: it travels the batches' way (the sequencer keeps it behind them) and the
  // gateway hands it over (start()), so it follows every partition it covers into the backend.
  void emit_mark(Flight::Mark m) {
    auto flight = std::make_unique<Flight>();
    flight->mark = m;
    const uint64_t id = next_batch_id++;
    flight->id = id;
    Flight* f = flight.get();
    batches.emplace(id, InflightBatch{{}, std::move(flight), now()});
    graph.emit(f);
  }

  void pump() {
    if (auto w = driver.pump(now(), *this)) timer.wake_at(*w);
  }

  // DispatchSink: the policy's batch becomes a flight on its way through the stages to the backend's gateway.
  bool dispatch(Batch& batch, Nanos at) override {
    auto flight = std::make_unique<Flight>();
    flight->views.reserve(batch.size());
    uint64_t bytes = 0;
    bool staged = false;
    for (const PartRef& p : batch)  // all checked before anything is counted as in flight
      if (!live.count(p.task_id))
        throw PolicyFault("policy '" + std::string(policy->name()) + "' dispatched a partition of unknown task " +
                          std::to_string(p.task_id));
    for (const PartRef& p : batch) {
      TaskState* t = live.find(p.task_id)->second.get();
      if (t->first_dispatch < 0) t->first_dispatch = at;
      ++t->in_flight;
      staged = staged || t->staged;
      flight->views.push_back(PartitionView{&t->desc, p.index, p.offset, p.bytes});
      bytes += p.bytes;
    }
    if (staged) {
      const size_t n = graph.stages().size();
      flight->staged.resize(batch.size());
      for (size_t i = 0; i < batch.size(); ++i) {
        flight->staged[i].task = flight->views[i].task;
        flight->staged[i].inputs.resize(n);
        flight->staged[i].states.resize(n);
      }
    }
    const uint64_t id = next_batch_id++;
    flight->id = id;
    stat_partitions.fetch_add(batch.size(), std::memory_order_relaxed);
    stat_batches.fetch_add(1, std::memory_order_relaxed);
    stat_bytes.fetch_add(bytes, std::memory_order_relaxed);
    Flight* f = flight.get();
    batches.emplace(id, InflightBatch{std::move(batch), std::move(flight), at});
    graph.emit(f);
    return true;
  }

  // Gateway body (any graph thread): hands the flight to the backend. A closing engine or a throwing backend
  // completes it with an error instead.
  void start(Flight* f, std::function<void(const Status&)> done) {
    if (closed.load(std::memory_order_acquire))
      return done(Status::Error("engine shut down before the batch was started", Status::Code::cancelled));
    if (f->mark != Flight::Mark::none) {
      caps.global_order->mark(f->mark == Flight::Mark::backward);
      return done(Status::Ok());
    }
    uint64_t wire = 0;
    for (const PartitionView& v : f->views) wire += v.bytes;
    stat_wire_bytes.fetch_add(wire, std::memory_order_relaxed);
    const uint64_t id = f->id;
    try {
      // Unstaged views are not needed after start (nothing decodes them): the backend may have them.
      std::vector<PartitionView> views = f->staged.empty() ? std::move(f->views) : f->views;
      if (caps.reports_sent) {
        backend->start_with_sent(std::move(views), [this, id](const Status&) {
          Event e;
          e.kind = Event::Kind::batch_sent;
          e.id = id;
          post(std::move(e));
        }, done);  // copied (small): a backend that throws leaves us `done` to report it with
      } else {
        backend->start(std::move(views), done);
      }
    } catch (const std::exception& ex) {
      done(Status::Error("backend '" + std::string(backend->name()) + "' failed to start: " + ex.what()));
    } catch (...) {
      done(Status::Error("backend '" + std::string(backend->name()) + "' failed to start: a non-standard exception"));
    }
  }

  // The batch has left this worker: its bytes no longer count against the credit, although its result is pending.
  void on_batch_sent(uint64_t id) {
    auto it = batches.find(id);
    if (it == batches.end() || it->second.released || !fault.empty()) return;
    it->second.released = true;
    driver.batch_done(it->second.parts, now());
  }

  void on_batch_done(uint64_t id, const Status& s) {
    auto it = batches.find(id);
    if (it == batches.end()) return;  // after shutdown: already failed
    InflightBatch done = std::move(it->second);
    batches.erase(it);
    if (done.parts.empty()) return;  // an iteration mark (emit_mark)
    const Nanos at = now();
    if (timeline) {
      const auto first = live.find(done.parts.front().task_id);
      trace_batch(*timeline, next_span_id++, done.parts, first != live.end() ? &first->second->desc : nullptr,
                  done.dispatched, at, s.ok());
    }
    for (const PartRef& p : done.parts) {
      auto t = live.find(p.task_id);
      if (t == live.end()) continue;
      TaskState& st = *t->second;
      --st.in_flight;
      if (!s.ok() && st.status.ok()) st.status = s;
      --st.remaining;
      if (st.remaining == 0 || (!fault.empty() && st.in_flight == 0)) finish_live(t);
    }
    // Last: the policy may throw, and the tasks above must be accounted for first.
    if (!done.released && fault.empty()) driver.batch_done(done.parts, at);
  }

  void finish_live(std::unordered_map<uint64_t, std::unique_ptr<TaskState>>::iterator it) {
    std::unique_ptr<TaskState> owned = std::move(it->second);
    live.erase(it);
    finish(std::move(owned));
  }

  void finish(std::unique_ptr<TaskState> t) {
    if (timeline) trace_task(*timeline, next_span_id, t->desc, t->submitted, t->first_dispatch, now());
    registry.release(t->desc.name);
    Status reported = t->status;
    if (!t->status.ok()) stat_failed.fetch_add(1, std::memory_order_relaxed);
    if (t->callback) {
      try {
        t->callback(t->status);
      } catch (const std::exception& ex) {
        reported = callback_failure(t->desc.name, ex.what());
      } catch (...) {
        reported = callback_failure(t->desc.name, "a non-standard exception");
      }
    }
    stat_completed.fetch_add(1, std::memory_order_relaxed);
    tasks.recycle(std::move(t));  // before done(): a waiter may destroy the engine once its last task is done
    waits.done(reported);
  }

  Status callback_failure(const std::string& task, const std::string& what) {
    const std::string msg = "callback of task '" + task + "' threw: " + what;
    std::fprintf(stderr, "commsched engine: %s\n", msg.c_str());
    return Status::Error(msg);
  }

  // The policy (or the scheduler itself) failed: nothing more is dispatched. Tasks with nothing in flight fail now;
  // the others when their batches come back (their views point into the tasks); later tasks fail on arrival.
  void break_engine(const std::string& why) {
    if (!fault.empty()) return;
    fault = why;
    std::fprintf(stderr, "commsched engine: %s; failing every pending and later task\n", why.c_str());
    for (auto it = live.begin(); it != live.end();) {
      TaskState& t = *it->second;
      if (t.status.ok()) t.status = Status::Error("task '" + t.desc.name + "' failed: " + why);
      auto next = std::next(it);
      if (t.in_flight == 0) finish_live(it);
      it = next;
    }
  }

  void fail_everything() {
    stopped = true;
    batches.clear();
    while (!live.empty()) {
      auto it = live.begin();
      TaskState& t = *it->second;
      if (t.status.ok())
        t.status = Status::Error("engine shut down before task '" + t.desc.name + "' completed", Status::Code::cancelled);
      finish_live(it);
    }
    shutdown_done.store(true);
  }

  // ---------------------------------------------------------------- state
  std::unique_ptr<Policy> policy;  // ForwardPolicy where the global order runs the engine's own (local_policy)
  PolicyDriver driver;  // the one loop that drives the policy (scheduler/policy_driver.h)
  std::shared_ptr<CommBackend> backend;
  EngineConfig config;
  const bool splits;
  const BackendCapabilities caps;  // asked once: reports_sent (credit is released on `sent`), global_order
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

Engine::Engine(std::unique_ptr<Policy> policy, std::shared_ptr<CommBackend> backend, EngineConfig config,
               std::vector<std::shared_ptr<Stage>> extra_stages) {
  if (!policy) throw InvalidArgument("Engine: policy must not be null");
  if (!backend) throw InvalidArgument("Engine: backend must not be null");
  config.validate();
  impl_ = std::make_unique<Impl>(std::move(policy), std::move(backend), std::move(config), std::move(extra_stages));
}

Engine::~Engine() {
  try {
    shutdown();
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "commsched engine: error during shutdown: %s\n", ex.what());
  }
}

namespace {
void check_root(const Task& task, const CommBackend& backend) {
  if (task.op == Op::broadcast && task.root >= backend.size())
    throw InvalidArgument("task '" + task.name + "': broadcast root " + std::to_string(task.root) + " is not a rank (size " +
                          std::to_string(backend.size()) + ")");
}

const char* device_word(Device d) { return d == Device::cpu ? "CPU" : "CUDA"; }

// Walks the task through the stages it will take: each must accept it on the device it holds there (the compression
// codecs read host memory), and the backend must carry what the last one hands on (a device-to-host copy stage lets
// a host-only backend carry CUDA tensors).
void check_route(const TaskDesc& t, const std::vector<std::shared_ptr<Stage>>& stages, const CommBackend& backend) {
  auto task = [&] { return "task '" + t.name + "': "; };  // built only for an error: this runs on every submit
  Device at = t.buffer.device;
  for (const auto& st : stages) {
    if (!st->applies(t)) continue;
    if (st->reads_host_memory() && at != Device::cpu)
      throw InvalidArgument(task() + "stage '" + std::string(st->name()) + "' works on host memory, and backend '" +
                            std::string(backend.name()) + "' takes this " + device_word(at) +
                            " buffer as it is (no copy to the host); send it uncompressed");
    if (std::string why = st->refusal(t, backend); !why.empty()) throw InvalidArgument(task() + why);
    at = st->output_device(t).value_or(at);
  }
  if (backend.supports(t.op, at)) return;
  std::string msg = task() + "backend '" + std::string(backend.name()) + "' cannot carry " + std::string(op_name(t.op)) +
                    " on " + device_word(at) + " buffers";
  if (at == Device::cuda)
    msg += " (CUDA tensors reach a host-only backend through the device-copy stage, which this engine does not have: "
           "it comes with a build with CUDA, COMMSCHED_WITH_CUDA)";
  else
    msg += " (host tensors reach a device-only backend through the host-to-device copy stage, which this engine does "
           "not have)";
  throw InvalidArgument(msg);
}

// Broadcasts carry parameters and integers do not compress: both always travel as they are.
compression::Spec resolve_compression(const Task& task, const compression::Spec& dflt) {
  if (task.op == Op::broadcast || !compression::compressible(task.dtype)) return {};
  return task.compression.value_or(dflt);
}
}  // namespace

uint64_t Engine::submit(Task task) {
  Impl& m = *impl_;
  if (m.closed.load()) throw InvalidArgument("task '" + task.name + "' submitted after the engine was shut down");
  validate_task(task);
  check_root(task, *m.backend);
  std::unique_ptr<TaskState> t = m.tasks.take();
  t->desc.key = task_key(task.name);
  t->desc.name = task.name;
  t->desc.priority = task.priority;
  t->desc.op = task.op;
  t->desc.dtype = task.dtype;
  t->desc.count = task.count;
  t->desc.buffer = task.buffer;
  t->desc.root = task.root;
  t->desc.compression = resolve_compression(task, m.config.compression);
  check_route(t->desc, m.graph.stages(), *m.backend);
  {
    std::lock_guard lk(m.marks_mu);
    std::tie(t->desc.id, t->desc.round) = m.registry.admit(t->desc.name);
    m.waits.add();
  }
  t->desc.iteration = m.iteration.load(std::memory_order_relaxed);
  t->callback = std::move(task.on_done);
  t->submitted = m.now();
  m.stat_submitted.fetch_add(1, std::memory_order_relaxed);
  const uint64_t id = t->desc.id;
  const uint64_t pbytes = m.splits ? m.active_partition_bytes.load(std::memory_order_relaxed) : 0;
  if (partition_count(t->desc.count, t->desc.dtype, pbytes) <= kInlinePartitionLimit) {
    m.partition_and_post(t.release());
    m.graph.kick();
  } else {
    m.graph.partition(t.release());
  }
  return id;
}

void Engine::backward_done() {
  Impl& m = *impl_;
  if (m.closed.load()) return;
  uint64_t submitted;
  Knobs k;
  {
    std::lock_guard lk(m.marks_mu);
    submitted = m.registry.submitted();
    std::lock_guard kl(m.knobs_mu);
    k = m.pending_knobs;
    m.iteration.fetch_add(1);
    m.active_partition_bytes.store(k.partition_bytes);
  }
  Event mark;
  mark.kind = Event::Kind::backward_done;
  mark.id = submitted;
  m.post(std::move(mark));
  Event kn;
  kn.kind = Event::Kind::knobs;
  kn.knobs = k;
  m.post(std::move(kn));
  if (m.timeline) {
    trace_stragglers(*m.timeline, m.now(), m.backend->stragglers());
    trace_backward_done(*m.timeline, m.now(), m.iteration.load(), k);
  }
}

void Engine::flush() {
  Impl& m = *impl_;
  if (m.closed.load()) return;
  Event mark;
  mark.kind = Event::Kind::flush;
  {
    std::lock_guard lk(m.marks_mu);
    mark.id = m.registry.submitted();
  }
  m.post(std::move(mark));
}

Status Engine::wait_all() { return impl_->waits.wait(); }

int Engine::join() {
  Impl& m = *impl_;
  if (!m.caps.joins)
    throw InvalidArgument("join: the " + std::string(m.backend->name()) +
                          " backend cannot stand in for a rank that has joined (use the parameter server)");
  flush();
  if (Status st = wait_all(); !st.ok()) throw std::runtime_error("join: a task of this rank failed: " + st.message);
  const int last = m.backend->join();
  m.registry.restart_rounds();
  return last;
}

bool Engine::wait_all_for(std::chrono::nanoseconds timeout) { return impl_->waits.wait_for(timeout); }

void Engine::shutdown() {
  Impl& m = *impl_;
  std::lock_guard lk(m.shutdown_mu);
  if (m.shut_down) return;
  m.shut_down = true;
  m.closed.store(true);
  m.graph.wait_idle();    // every task handed to the partition node has arrived; stages have run
  m.backend->shutdown();  // after this no completion callback runs any more
  m.graph.wait_idle();    // completions the backend delivered have passed the decode chain
  Event e;
  e.kind = Event::Kind::shutdown;
  m.post(std::move(e));
  // The driver thread delivers the kick; help run the graph until the scheduler has failed what was pending.
  while (!m.shutdown_done.load()) {
    m.graph.wait_idle();
    std::this_thread::yield();
  }
  m.timer.stop();
  m.graph.stop_driver();
  m.graph.wait_idle();
  if (m.timeline) m.timeline->flush();
}

Knobs Engine::knobs() const {
  std::lock_guard lk(impl_->knobs_mu);
  return impl_->pending_knobs;
}

void Engine::set_knobs(const Knobs& k) {
  std::lock_guard lk(impl_->knobs_mu);
  impl_->pending_knobs = k;
}

EngineStats Engine::stats() const {
  const Impl& m = *impl_;
  EngineStats s;
  s.tasks_submitted = m.stat_submitted.load();
  s.tasks_completed = m.stat_completed.load();
  s.tasks_failed = m.stat_failed.load();
  s.partitions_dispatched = m.stat_partitions.load();
  s.batches_dispatched = m.stat_batches.load();
  s.bytes_dispatched = m.stat_bytes.load();
  s.wire_bytes = m.stat_wire_bytes.load();
  s.iteration = m.iteration.load();
  return s;
}

uint64_t Engine::iteration() const { return impl_->iteration.load(); }
std::string_view Engine::policy_name() const { return impl_->policy->name(); }
CommBackend& Engine::backend() const { return *impl_->backend; }
Nanos Engine::now() const { return impl_->now(); }

}  // namespace commsched
