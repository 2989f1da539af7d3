#include "scheduler/engine.h"

#include <oneapi/tbb/concurrent_queue.h>
#include <oneapi/tbb/flow_graph.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "scheduler/timeline.h"

namespace commsched {
namespace {

// Tasks with more partitions than this are partitioned on the flow graph's parallel node instead of inline.
constexpr uint32_t kInlinePartitionLimit = 64;

struct TaskState {
  TaskDesc desc;
  TaskCallback callback;
  std::vector<PartRef> parts;
  uint32_t remaining = 0;
  Status status;
  Nanos submitted = 0;
  Nanos first_dispatch = -1;
};

struct Event {
  enum class Kind : uint8_t { arrived, batch_sent, batch_done, backward_done, flush, tick, knobs, shutdown };
  Kind kind = Kind::tick;
  TaskState* task = nullptr;  // arrived: ownership passes to the scheduler node
  uint64_t id = 0;            // batch_sent/batch_done: batch id; backward_done/flush: tasks submitted before it
  Status status;
  uint64_t credit = 0;        // knobs
};

struct InflightBatch {
  Batch parts;
  Nanos dispatched = 0;
  bool released = false;  // the policy has been told (on `sent`, for backends that report it)
};

}  // namespace

struct Engine::Impl {
  Impl(std::unique_ptr<Policy> p, std::shared_ptr<CommBackend> b, EngineConfig c)
      : policy(std::move(p)),
        backend(std::move(b)),
        config(std::move(c)),
        splits(policy->splits_tasks()),
        reports_sent(backend->reports_sent()),
        t0(std::chrono::steady_clock::now()),
        sched_node(graph, tbb::flow::serial, [this](tbb::flow::continue_msg) { run_scheduler(); return tbb::flow::continue_msg(); }),
        partition_node(graph, tbb::flow::unlimited, [this](TaskState* t) { partition_and_post(t); return tbb::flow::continue_msg(); }) {
    active_partition_bytes.store(config.knobs.partition_bytes);
    pending_knobs = config.knobs;
    if (backend->manages_credit()) {
      policy->set_credit_bytes(0);
      apply_credit(config.knobs.credit_bytes);
    }
    if (!config.timeline_path.empty())
      timeline = std::make_unique<Timeline>(config.timeline_path, backend->rank(), config.timeline_max_events);
    timer_thread = std::thread([this] { timer_loop(); });
    drive_thread = std::thread([this] { drive_loop(); });
  }

  Nanos now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }

  // ---------------------------------------------------------------- producer side (any thread)
  void post(Event&& e) {
    events.push(std::move(e));
    if (!kick_pending.exchange(true, std::memory_order_acq_rel)) request_drive(/*kick=*/true);
  }

  // The graph's tasks must run even where oneTBB has no worker thread (one CPU, or a cgroup of one): the driver
  // thread puts the kick into the scheduler node and then waits for the graph, which executes whatever is pending.
  // With worker threads available, they usually run the tasks first and the driver merely waits.
  void request_drive(bool kick) {
    std::lock_guard lk(drive_mu);
    if (kick) ++kicks_requested;
    drive_requested = true;
    drive_cv.notify_one();
  }

  void drive_loop() {
    std::unique_lock lk(drive_mu);
    while (true) {
      drive_cv.wait(lk, [&] { return drive_requested || drive_stop; });
      if (drive_stop) return;
      const uint64_t kicks = kicks_requested;
      kicks_requested = 0;
      drive_requested = false;
      lk.unlock();
      for (uint64_t i = 0; i < kicks; ++i) sched_node.try_put(tbb::flow::continue_msg());
      graph.wait_for_all();
      lk.lock();
    }
  }

  void partition_and_post(TaskState* t) {
    const uint64_t pbytes = splits ? active_partition_bytes.load(std::memory_order_relaxed) : 0;
    const std::vector<ByteRange> ranges = partition_ranges(t->desc.count, t->desc.dtype, pbytes);
    t->parts.reserve(ranges.size());
    for (uint32_t i = 0; i < ranges.size(); ++i)
      t->parts.push_back(PartRef{t->desc.id, i, t->desc.priority, t->desc.id, ranges[i].offset, ranges[i].bytes});
    t->desc.num_partitions = static_cast<uint32_t>(t->parts.size());
    t->remaining = t->desc.num_partitions;
    Event e;
    e.kind = Event::Kind::arrived;
    e.task = t;
    post(std::move(e));
  }

  // ---------------------------------------------------------------- scheduler node (serial)
  void run_scheduler() {
    do {
      kick_pending.store(false, std::memory_order_release);
      Event e;
      while (events.try_pop(e)) handle(e);
      if (!stopped) pump();
    } while (!events.empty());
  }

  void handle(Event& e) {
    try {
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
          if (!stopped) apply_credit(e.credit);
          break;
        case Event::Kind::shutdown: fail_everything(); break;
      }
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "commsched engine: internal error while handling an event: %s\n", ex.what());
    }
  }

  // The credit knob goes to the policy, or to the backend when it keeps the credit itself (then the policy has none).
  void apply_credit(uint64_t credit) {
    if (backend->manages_credit()) backend->set_credit_bytes(policy->uses_credit() ? credit : 0);
    else policy->set_credit_bytes(credit);
  }

  void on_arrived(TaskState* t) {
    ++arrived_tasks;
    std::unique_ptr<TaskState> owned(t);
    if (stopped) {
      owned->status = Status::Error("engine shut down before task '" + t->desc.name + "' was scheduled", Status::Code::cancelled);
      finish(std::move(owned));
      deliver_backward_marks();
      return;
    }
    const Nanos at = now();
    if (t->remaining == 0) {
      finish(std::move(owned));
    } else {
      TaskArrival arrival{t->desc.id, t->desc.priority, t->desc.id, t->desc.bytes(), t->parts};
      policy->on_task_arrived(arrival, at);
      live.emplace(t->desc.id, std::move(owned));
    }
    deliver_backward_marks();
  }

  // A backward_done (or flush) mark covers the tasks submitted before it; it reaches the policy only after they all
  // arrived, even when big tasks were still being partitioned on another thread.
  void deliver_backward_marks() {
    while (!backward_marks.empty() && arrived_tasks >= backward_marks.front().tasks) {
      const bool flush = backward_marks.front().flush;
      backward_marks.pop_front();
      if (stopped) continue;
      if (flush) policy->on_flush(now());
      else policy->on_backward_done(now());
    }
  }

  void pump() {
    const Nanos at = now();
    ready.clear();
    policy->poll(at, ready);
    for (Batch& b : ready) dispatch(std::move(b), at);
    ready.clear();
    schedule_wakeup(policy->next_wakeup());
  }

  void dispatch(Batch&& batch, Nanos at) {
    std::vector<PartitionView> views;
    views.reserve(batch.size());
    uint64_t bytes = 0;
    for (const PartRef& p : batch) {
      TaskState* t = live.at(p.task_id).get();
      if (t->first_dispatch < 0) t->first_dispatch = at;
      views.push_back(PartitionView{&t->desc, p.index, p.offset, p.bytes});
      bytes += p.bytes;
    }
    const uint64_t id = next_batch_id++;
    stat_partitions.fetch_add(batch.size(), std::memory_order_relaxed);
    stat_batches.fetch_add(1, std::memory_order_relaxed);
    stat_bytes.fetch_add(bytes, std::memory_order_relaxed);
    batches.emplace(id, InflightBatch{std::move(batch), at});
    auto notice = [this, id](Event::Kind kind) {
      return [this, id, kind](const Status& s) {
        Event e;
        e.kind = kind;
        e.id = id;
        e.status = s;
        post(std::move(e));
      };
    };
    try {
      if (reports_sent)
        backend->start_with_sent(std::move(views), notice(Event::Kind::batch_sent), notice(Event::Kind::batch_done));
      else
        backend->start(std::move(views), notice(Event::Kind::batch_done));
    } catch (const std::exception& ex) {
      Event e;
      e.kind = Event::Kind::batch_done;
      e.id = id;
      e.status = Status::Error(std::string("backend '") + std::string(backend->name()) + "' failed to start: " + ex.what());
      post(std::move(e));
    }
  }

  // The batch has left this worker: its bytes no longer count against the credit, although its result is pending.
  void on_batch_sent(uint64_t id) {
    auto it = batches.find(id);
    if (it == batches.end() || it->second.released) return;
    it->second.released = true;
    policy->on_batch_done(it->second.parts, now());
  }

  void on_batch_done(uint64_t id, const Status& s) {
    auto it = batches.find(id);
    if (it == batches.end()) return;  // after shutdown: already failed
    InflightBatch done = std::move(it->second);
    batches.erase(it);
    const Nanos at = now();
    if (!done.released) policy->on_batch_done(done.parts, at);
    if (timeline) record_batch(done, at, s);
    for (const PartRef& p : done.parts) {
      auto t = live.find(p.task_id);
      if (t == live.end()) continue;
      TaskState& st = *t->second;
      if (!s.ok() && st.status.ok()) st.status = s;
      if (--st.remaining == 0) {
        std::unique_ptr<TaskState> owned = std::move(t->second);
        live.erase(t);
        finish(std::move(owned));
      }
    }
  }

  void record_batch(const InflightBatch& b, Nanos at, const Status& s) {
    const auto first = live.find(b.parts.front().task_id);
    std::string name = first != live.end() ? first->second->desc.name : "?";
    name += "[" + std::to_string(b.parts.front().index) + "]";
    if (b.parts.size() > 1) name += "+" + std::to_string(b.parts.size() - 1);
    uint64_t bytes = 0;
    for (const PartRef& p : b.parts) bytes += p.bytes;
    std::string args = "{\"bytes\":" + std::to_string(bytes) + ",\"partitions\":" + std::to_string(b.parts.size()) +
                       ",\"ok\":" + (s.ok() ? "true" : "false") + "}";
    timeline->span("partition", name, next_span_id++, b.dispatched, at, args);
  }

  void finish(std::unique_ptr<TaskState> t) {
    const Nanos at = now();
    if (timeline) {
      const Nanos start = t->first_dispatch >= 0 ? t->first_dispatch : at;
      std::string args = "{\"bytes\":" + std::to_string(t->desc.bytes()) + ",\"priority\":" +
                         std::to_string(t->desc.priority) + ",\"iteration\":" + std::to_string(t->desc.iteration) + "}";
      timeline->span("queued", t->desc.name, next_span_id++, t->submitted, start, args);
      timeline->span("communicating", t->desc.name, next_span_id++, start, at, args);
    }
    {
      std::lock_guard lk(names_mu);
      names_in_flight.erase(t->desc.name);
    }
    if (!t->status.ok()) stat_failed.fetch_add(1, std::memory_order_relaxed);
    if (t->callback) {
      try {
        t->callback(t->status);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "commsched engine: callback of task '%s' threw: %s\n", t->desc.name.c_str(), ex.what());
      } catch (...) {
        std::fprintf(stderr, "commsched engine: callback of task '%s' threw a non-standard exception\n", t->desc.name.c_str());
      }
    }
    stat_completed.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lk(wait_mu);
    if (--outstanding == 0) wait_cv.notify_all();
  }

  void fail_everything() {
    stopped = true;
    batches.clear();
    while (!live.empty()) {
      auto it = live.begin();
      std::unique_ptr<TaskState> t = std::move(it->second);
      live.erase(it);
      if (t->status.ok())
        t->status = Status::Error("engine shut down before task '" + t->desc.name + "' completed", Status::Code::cancelled);
      finish(std::move(t));
    }
    shutdown_done.store(true);
  }

  // ---------------------------------------------------------------- policy wake-ups (fusion cycles and the like)
  void schedule_wakeup(std::optional<Nanos> at) {
    if (!at) return;
    std::lock_guard lk(timer_mu);
    if (!wakeup_at || *at < *wakeup_at) {
      wakeup_at = *at;
      timer_cv.notify_one();
    }
  }

  void timer_loop() {
    std::unique_lock lk(timer_mu);
    while (!timer_stop) {
      if (!wakeup_at) {
        timer_cv.wait(lk);
        continue;
      }
      const auto deadline = t0 + std::chrono::nanoseconds(*wakeup_at);
      if (timer_cv.wait_until(lk, deadline) == std::cv_status::timeout || std::chrono::steady_clock::now() >= deadline) {
        if (wakeup_at && std::chrono::steady_clock::now() >= t0 + std::chrono::nanoseconds(*wakeup_at)) {
          wakeup_at.reset();
          lk.unlock();
          Event e;
          e.kind = Event::Kind::tick;
          post(std::move(e));
          lk.lock();
        }
      }
    }
  }

  // ---------------------------------------------------------------- state
  std::unique_ptr<Policy> policy;
  std::shared_ptr<CommBackend> backend;
  EngineConfig config;
  const bool splits;
  const bool reports_sent;  // the backend tells when a batch has left (credit is released then, not at completion)
  const std::chrono::steady_clock::time_point t0;
  std::unique_ptr<Timeline> timeline;

  tbb::flow::graph graph;
  tbb::flow::function_node<tbb::flow::continue_msg, tbb::flow::continue_msg> sched_node;
  tbb::flow::function_node<TaskState*, tbb::flow::continue_msg> partition_node;
  tbb::concurrent_queue<Event> events;
  std::atomic<bool> kick_pending{false};

  // Scheduler-node state: touched only by run_scheduler().
  std::unordered_map<uint64_t, std::unique_ptr<TaskState>> live;
  std::unordered_map<uint64_t, InflightBatch> batches;
  struct Mark {
    uint64_t tasks;  // submitted before the mark
    bool flush;      // Engine::flush rather than backward_done
  };
  std::deque<Mark> backward_marks;
  std::vector<Batch> ready;
  uint64_t arrived_tasks = 0;
  uint64_t next_batch_id = 1;
  uint64_t next_span_id = 1;
  bool stopped = false;

  // Submit-side state.
  std::mutex names_mu;
  std::unordered_set<std::string> names_in_flight;
  std::unordered_map<std::string, uint64_t> rounds;
  uint64_t next_task_id = 0;  // under names_mu: ids are dense and in submission order
  std::atomic<uint64_t> iteration{0};
  std::atomic<uint64_t> active_partition_bytes{0};
  mutable std::mutex knobs_mu;
  Knobs pending_knobs;
  std::atomic<bool> closed{false};
  std::atomic<bool> shutdown_done{false};
  std::mutex shutdown_mu;
  bool shut_down = false;  // under shutdown_mu

  std::mutex wait_mu;
  std::condition_variable wait_cv;
  uint64_t outstanding = 0;

  std::mutex drive_mu;
  std::condition_variable drive_cv;
  uint64_t kicks_requested = 0;
  bool drive_requested = false;
  bool drive_stop = false;
  std::thread drive_thread;

  std::mutex timer_mu;
  std::condition_variable timer_cv;
  std::optional<Nanos> wakeup_at;
  bool timer_stop = false;
  std::thread timer_thread;

  std::atomic<uint64_t> stat_submitted{0}, stat_completed{0}, stat_failed{0}, stat_partitions{0}, stat_batches{0},
      stat_bytes{0};
};

Engine::Engine(std::unique_ptr<Policy> policy, std::shared_ptr<CommBackend> backend, EngineConfig config) {
  if (!policy) throw InvalidArgument("Engine: policy must not be null");
  if (!backend) throw InvalidArgument("Engine: backend must not be null");
  config.validate();
  impl_ = std::make_unique<Impl>(std::move(policy), std::move(backend), std::move(config));
}

Engine::~Engine() {
  try {
    shutdown();
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "commsched engine: error during shutdown: %s\n", ex.what());
  }
}

uint64_t Engine::submit(Task task) {
  Impl& m = *impl_;
  if (m.closed.load()) throw InvalidArgument("task '" + task.name + "' submitted after the engine was shut down");
  validate_task(task);
  if (!m.backend->supports(task.op, task.buffer.device))
    throw InvalidArgument("task '" + task.name + "': backend '" + std::string(m.backend->name()) + "' cannot carry " +
                          std::string(op_name(task.op)) + " on " + (task.buffer.device == Device::cpu ? "CPU" : "CUDA") +
                          " buffers");
  if (task.op == Op::broadcast && task.root >= m.backend->size())
    throw InvalidArgument("task '" + task.name + "': broadcast root " + std::to_string(task.root) + " is not a rank (size " +
                          std::to_string(m.backend->size()) + ")");
  auto t = std::make_unique<TaskState>();
  {
    std::lock_guard lk(m.names_mu);
    if (m.names_in_flight.count(task.name))
      throw InvalidArgument("task '" + task.name + "' submitted while a task with the same name is still in flight");
    m.names_in_flight.insert(task.name);
    t->desc.round = m.rounds[task.name]++;
    t->desc.id = m.next_task_id++;
    std::lock_guard wk(m.wait_mu);
    ++m.outstanding;
  }
  t->desc.key = task_key(task.name);
  t->desc.name = std::move(task.name);
  t->desc.priority = task.priority;
  t->desc.op = task.op;
  t->desc.dtype = task.dtype;
  t->desc.count = task.count;
  t->desc.buffer = task.buffer;
  t->desc.root = task.root;
  t->desc.iteration = m.iteration.load(std::memory_order_relaxed);
  t->callback = std::move(task.on_done);
  t->submitted = m.now();
  m.stat_submitted.fetch_add(1, std::memory_order_relaxed);
  const uint64_t id = t->desc.id;
  const uint64_t pbytes = m.splits ? m.active_partition_bytes.load(std::memory_order_relaxed) : 0;
  if (partition_count(t->desc.count, t->desc.dtype, pbytes) <= kInlinePartitionLimit) {
    m.partition_and_post(t.release());
  } else {
    m.partition_node.try_put(t.release());
    m.request_drive(/*kick=*/false);
  }
  return id;
}

void Engine::backward_done() {
  Impl& m = *impl_;
  if (m.closed.load()) return;
  uint64_t submitted;
  Knobs k;
  {
    std::lock_guard lk(m.names_mu);
    submitted = m.next_task_id;
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
  kn.credit = k.credit_bytes;
  m.post(std::move(kn));
  if (m.timeline) {
    m.timeline->instant("backward_done", m.now(),
                        "{\"iteration\":" + std::to_string(m.iteration.load()) + ",\"partition_bytes\":" +
                            std::to_string(k.partition_bytes) + ",\"credit_bytes\":" + std::to_string(k.credit_bytes) + "}");
    m.timeline->flush();
  }
}

void Engine::flush() {
  Impl& m = *impl_;
  if (m.closed.load()) return;
  Event mark;
  mark.kind = Event::Kind::flush;
  {
    std::lock_guard lk(m.names_mu);
    mark.id = m.next_task_id;
  }
  m.post(std::move(mark));
}

void Engine::wait_all() {
  std::unique_lock lk(impl_->wait_mu);
  impl_->wait_cv.wait(lk, [&] { return impl_->outstanding == 0; });
}

bool Engine::wait_all_for(std::chrono::nanoseconds timeout) {
  std::unique_lock lk(impl_->wait_mu);
  return impl_->wait_cv.wait_for(lk, timeout, [&] { return impl_->outstanding == 0; });
}

void Engine::shutdown() {
  Impl& m = *impl_;
  std::lock_guard lk(m.shutdown_mu);
  if (m.shut_down) return;
  m.shut_down = true;
  m.closed.store(true);
  m.graph.wait_for_all();  // every task handed to the partition node has arrived
  m.backend->shutdown();   // after this no completion callback runs any more
  Event e;
  e.kind = Event::Kind::shutdown;
  m.post(std::move(e));
  // The driver thread delivers the kick; help run the graph until the scheduler has failed what was pending.
  while (!m.shutdown_done.load()) {
    m.graph.wait_for_all();
    std::this_thread::yield();
  }
  {
    std::lock_guard tl(m.timer_mu);
    m.timer_stop = true;
    m.timer_cv.notify_all();
  }
  if (m.timer_thread.joinable()) m.timer_thread.join();
  {
    std::lock_guard dl(m.drive_mu);
    m.drive_stop = true;
    m.drive_cv.notify_all();
  }
  if (m.drive_thread.joinable()) m.drive_thread.join();
  m.graph.wait_for_all();
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
  s.iteration = m.iteration.load();
  return s;
}

uint64_t Engine::iteration() const { return impl_->iteration.load(); }
std::string_view Engine::policy_name() const { return impl_->policy->name(); }
CommBackend& Engine::backend() const { return *impl_->backend; }
Nanos Engine::now() const { return impl_->now(); }

}  // namespace commsched
