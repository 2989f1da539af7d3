#include "scheduler/engine_graph.h"

#include <cstdio>
#include <string>

#include "scheduler/tsan_handoff.h"

namespace commsched {
namespace {
using tbb::flow::make_edge;
using tbb::flow::output_port;
using tbb::flow::serial;
using tbb::flow::unlimited;

// A flight (or a task) crosses threads on every edge: oneTBB hands the message to a task that any of its workers runs,
// through Debian's libtbb, which ThreadSanitizer does not see into. So what one node (or the backend) wrote before a
// put, a stage's staging buffer say, looked unordered with what the next node reads (a false race report on every
// host-to-device copy back). Every put releases the item, every body acquires it first.
template <class Port, class T>
void put(Port& port, T* item) {
  handed_over(item);
  port.try_put(item);
}

std::string stage_failure(const Stage& st, const char* what, const PartitionView& v, const char* ex) {
  return "stage '" + std::string(st.name()) + "' failed to " + what + " task '" + v.task->name + "' partition " +
         std::to_string(v.index) + ": " + ex;
}
}  // namespace

EngineGraph::EngineGraph(Hooks hooks, std::vector<std::shared_ptr<Stage>> stages)
    : hooks_(std::move(hooks)),
      stages_(std::move(stages)),
      graph_(*arena_graph_.graph),
      partition_node_(graph_, unlimited,
                      [this](TaskState* t, auto& ports) {
                        taken_over(t);
                        hooks_.partition(t);  // posts the arrival (never throws: partitioning is arithmetic)
                        if (!kick_pending_.exchange(true, std::memory_order_acq_rel)) std::get<0>(ports).try_put(Kick());
                      }),
      sched_node_(graph_, serial,
                  [this](Kick, auto& ports) {
                    sched_ports_ = &ports;
                    hooks_.schedule();
                    send_group();
                    sched_ports_ = nullptr;
                  }),
      sequencer_(graph_, [](Flight* const& f) { return static_cast<size_t>(f->seq); }),
      gateway_(graph_, serial,
               [this](Flight* head, auto& /*gateway*/) {
                 taken_over(head);  // a group was written by the scheduler body, before one put of its head
                 for (Flight* f = head; f != nullptr;) {
                   Flight* next = f->next;  // read first: once started, f may complete and be freed at any time
                   if (!f->status.ok()) on_backend_done(f, f->status);  // a stage failed: skip the backend
                   else hooks_.start(f, [this, f](const Status& s) { on_backend_done(f, s); });
                   f = next;
                 }
               }),
      completion_node_(graph_, unlimited, [this](Flight* f, auto& ports) {
        taken_over(f);
        hooks_.completed(f);
        if (!kick_pending_.exchange(true, std::memory_order_acq_rel)) std::get<0>(ports).try_put(Kick());
      }) {
  make_edge(output_port<0>(partition_node_), sched_node_);
  make_edge(output_port<0>(completion_node_), sched_node_);
  make_edge(output_port<1>(sched_node_), sequencer_);  // flights no stage applies to
  make_edge(sequencer_, gateway_);
  build_stage_nodes();
  drive_thread_ = std::thread([this] { drive_loop(); });
}

EngineGraph::~EngineGraph() {
  stop_driver();
  graph_.wait_for_all();
}

// encode[0] → … → encode[n-1] → gateway → decode[n-1] → … → decode[0] → completion. With no stages the scheduler's
// port 0 stays unconnected and every flight takes port 1.
void EngineGraph::build_stage_nodes() {
  const size_t n = stages_.size();
  if (n == 0) return;
  for (size_t k = 0; k < n; ++k) {
    const size_t limit = stages_[k]->concurrency() == 0 ? size_t{unlimited} : stages_[k]->concurrency();
    encode_nodes_.push_back(std::make_unique<FlightNode>(graph_, limit, [this, k](Flight* f, auto& ports) {
      taken_over(f);
      encode_with(k, f);
      put(std::get<0>(ports), f);
    }));
    decode_nodes_.push_back(std::make_unique<FlightNode>(graph_, limit, [this, k](Flight* f, auto& ports) {
      taken_over(f);
      decode_with(k, f);
      put(std::get<0>(ports), f);
    }));
  }
  make_edge(output_port<0>(sched_node_), *encode_nodes_[0]);
  for (size_t k = 0; k + 1 < n; ++k) make_edge(output_port<0>(*encode_nodes_[k]), *encode_nodes_[k + 1]);
  make_edge(output_port<0>(*encode_nodes_[n - 1]), sequencer_);
  make_edge(gateway_, *decode_nodes_[n - 1]);
  for (size_t k = n - 1; k > 0; --k) make_edge(output_port<0>(*decode_nodes_[k]), *decode_nodes_[k - 1]);
  make_edge(output_port<0>(*decode_nodes_[0]), completion_node_);
}

void EngineGraph::encode_with(size_t k, Flight* f) {
  if (!f->status.ok()) return;
  Stage& st = *stages_[k];
  for (size_t i = 0; i < f->views.size(); ++i) {
    Flight::Staged& s = f->staged[i];
    PartitionView& v = f->views[i];
    if (!st.applies(*s.task)) continue;
    try {
      s.inputs[k] = v;
      PartitionView out = v;
      st.encode(s.inputs[k], out, s.states[k]);
      v = out;
    } catch (const std::exception& ex) {
      f->status = Status::Error(stage_failure(st, "encode", v, ex.what()));
      s.inputs[k] = PartitionView{};  // nothing to decode for this stage
      return;
    } catch (...) {
      f->status = Status::Error(stage_failure(st, "encode", v, "a non-standard exception"));
      s.inputs[k] = PartitionView{};
      return;
    }
  }
}

// Decodes what stage k encoded; after a failure (the backend's or a stage's) the views go back to the task's own
// ranges untouched, so nothing half-decoded is written into the task.
void EngineGraph::decode_with(size_t k, Flight* f) {
  Stage& st = *stages_[k];
  for (size_t i = 0; i < f->views.size(); ++i) {
    Flight::Staged& s = f->staged[i];
    if (!s.inputs[k].task) continue;
    if (f->status.ok()) {
      try {
        st.decode(f->views[i], s.inputs[k], s.states[k]);
      } catch (const std::exception& ex) {
        f->status = Status::Error(stage_failure(st, "decode", s.inputs[k], ex.what()));
      } catch (...) {
        f->status = Status::Error(stage_failure(st, "decode", s.inputs[k], "a non-standard exception"));
      }
    }
    f->views[i] = s.inputs[k];
    s.states[k].reset();
  }
}

// The backend's done: exactly once per flight (the CommBackend contract). A second call that comes before the
// scheduler handled the first (an inline double call, say) is reported and ignored; one after it is a backend bug the
// engine cannot see, since the flight is gone by then.
void EngineGraph::on_backend_done(Flight* f, const Status& s) {
  if (f->completed.exchange(true, std::memory_order_acq_rel)) {
    std::fprintf(stderr, "commsched engine: backend completed batch %llu twice; the second completion is ignored\n",
                 static_cast<unsigned long long>(f->id));
    return;
  }
  if (!s.ok() && f->status.ok()) f->status = s;
  if (f->staged.empty()) {
    hooks_.completed(f);
    kick();
    return;
  }
  put(gateway_.gateway(), f);  // on to the decode chain, from whatever thread the backend called us on
  request_drive(/*kick=*/false);  // where oneTBB has no worker thread, the driver runs that work
}

void EngineGraph::emit(Flight* f) {
  if (f->staged.empty()) {
    if (group_tail_) group_tail_->next = f;
    else group_head_ = f;
    group_tail_ = f;
    return;
  }
  send_group();  // what was dispatched before this flight goes before it
  f->seq = next_seq_++;
  put(std::get<0>(*sched_ports_), f);
}

void EngineGraph::send_group() {
  if (!group_head_) return;
  Flight* head = group_head_;
  group_head_ = group_tail_ = nullptr;
  head->seq = next_seq_++;
  put(std::get<1>(*sched_ports_), head);
}

void EngineGraph::partition(TaskState* t) {
  put(partition_node_, t);
  request_drive(/*kick=*/false);
}

void EngineGraph::kick() {
  if (!kick_pending_.exchange(true, std::memory_order_acq_rel)) request_drive(/*kick=*/true);
}

void EngineGraph::request_drive(bool kick) {
  std::lock_guard lk(drive_mu_);
  if (kick) ++kicks_requested_;
  drive_requested_ = true;
  drive_cv_.notify_one();
}

void EngineGraph::drive_loop() {
  std::unique_lock lk(drive_mu_);
  while (true) {
    drive_cv_.wait(lk, [&] { return drive_requested_ || drive_stop_; });
    if (drive_stop_) return;
    const uint64_t kicks = kicks_requested_;
    kicks_requested_ = 0;
    drive_requested_ = false;
    lk.unlock();
    for (uint64_t i = 0; i < kicks; ++i) sched_node_.try_put(Kick());
    graph_.wait_for_all();
    lk.lock();
  }
}

void EngineGraph::stop_driver() {
  {
    std::lock_guard lk(drive_mu_);
    drive_stop_ = true;
    drive_cv_.notify_all();
  }
  if (drive_thread_.joinable()) drive_thread_.join();
}

}  // namespace commsched
