// The engine's serial scheduler node (scheduler/engine_impl.h): it takes the events posted from any thread, drives
// the policy through the PolicyDriver, sends the batches the policy dispatches through the stages to the backend's
// gateway, and accounts for what comes back (sent notices, completions), finishing tasks and calling their callbacks.
#include <cstdio>

#include "scheduler/engine_impl.h"
#include "scheduler/engine_trace.h"
#include "scheduler/global_order.h"

namespace commsched {

const char* Engine::Impl::event_name(Event::Kind k) {
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

void Engine::Impl::run_scheduler() {
  do {
    graph.begin_drain();
    Event e;
    while (events.try_pop(e)) handle(e);
    // Once shutdown began nothing new is dispatched: what the policy still holds is cancelled with the rest.
    if (!stopped && fault.empty() && !closed.load(std::memory_order_acquire)) guarded("a poll", [&] { pump(); });
  } while (!events.empty());
}

void Engine::Impl::handle(Event& e) {
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

void Engine::Impl::apply_knobs(const Knobs& k) {
  if (caps.global_order) caps.global_order->post(k);
  driver.set_knobs(k);
}

void Engine::Impl::on_arrived(TaskState* t) {
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

void Engine::Impl::deliver_backward_marks() {
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

void Engine::Impl::emit_mark(Flight::Mark m) {
  auto flight = std::make_unique<Flight>();
  flight->mark = m;
  const uint64_t id = next_batch_id++;
  flight->id = id;
  Flight* f = flight.get();
  batches.emplace(id, InflightBatch{{}, std::move(flight), now()});
  graph.emit(f);
}

void Engine::Impl::pump() {
  if (auto w = driver.pump(now(), *this)) timer.wake_at(*w);
}

bool Engine::Impl::dispatch(Batch& batch, Nanos at) {
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

void Engine::Impl::start(Flight* f, std::function<void(const Status&)> done) {
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
    BatchDone sent;
    if (caps.reports_sent)
      sent = [this, id](const Status&) {
        Event e;
        e.kind = Event::Kind::batch_sent;
        e.id = id;
        post(std::move(e));
      };
    backend->start(std::move(views), std::move(sent), done);  // `done` copied (small): a backend that throws leaves
                                                                // us `done` to report it with
  } catch (const std::exception& ex) {
    done(Status::Error("backend '" + std::string(backend->name()) + "' failed to start: " + ex.what()));
  } catch (...) {
    done(Status::Error("backend '" + std::string(backend->name()) + "' failed to start: a non-standard exception"));
  }
}

void Engine::Impl::on_batch_sent(uint64_t id) {
  auto it = batches.find(id);
  if (it == batches.end() || it->second.released || !fault.empty()) return;
  it->second.released = true;
  driver.batch_done(it->second.parts, now());
}

void Engine::Impl::on_batch_done(uint64_t id, const Status& s) {
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

void Engine::Impl::finish_live(std::unordered_map<uint64_t, std::unique_ptr<TaskState>>::iterator it) {
  std::unique_ptr<TaskState> owned = std::move(it->second);
  live.erase(it);
  finish(std::move(owned));
}

void Engine::Impl::finish(std::unique_ptr<TaskState> t) {
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

Status Engine::Impl::callback_failure(const std::string& task, const std::string& what) {
  const std::string msg = "callback of task '" + task + "' threw: " + what;
  std::fprintf(stderr, "commsched engine: %s\n", msg.c_str());
  return Status::Error(msg);
}

void Engine::Impl::break_engine(const std::string& why) {
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

void Engine::Impl::fail_everything() {
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

}  // namespace commsched
