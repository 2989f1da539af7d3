#include "bench/sim/simulator.h"

#include <limits>
#include <optional>
#include <queue>

#include "scheduler/task.h"

namespace commsched::sim {
namespace {

struct Event {
  enum class Kind { compute_done, batch_sent, batch_done, wakeup };
  Nanos time;
  uint64_t seq;  // ties: in the order scheduled, so runs are deterministic
  Kind kind;
  size_t index;  // batch index for batch_sent and batch_done
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

struct TaskState {
  size_t layer;
  int iteration;
  uint32_t parts_left;
};

class Run {
 public:
  Run(const ModelProfile& m, NetworkModel& n, Policy& p, const SimOptions& o)
      : model_(m), net_(n), policy_(p), opt_(o), layer_pending_(m.layers.size(), 0) {}

  SimResult go();

 private:
  void schedule(Nanos t, Event::Kind kind, size_t index = 0) { events_.push({t, next_seq_++, kind, index}); }
  void try_start_compute(Nanos now);
  void on_compute_done(Nanos now);
  void submit_layer(size_t layer, Nanos now);
  void on_batch_sent(size_t index, Nanos now);
  void on_batch_done(size_t index, Nanos now);
  void pump(Nanos now);
  void record(Span::Lane lane, int iteration, Nanos start, Nanos end, int32_t first, int32_t last, uint64_t bytes,
              uint32_t parts);

  const ModelProfile& model_;
  NetworkModel& net_;
  Policy& policy_;
  const SimOptions& opt_;
  SimResult result_;

  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t next_seq_ = 0;
  std::optional<Nanos> wake_scheduled_;

  // Compute stream: iteration, phase and layer of the next (or running) step.
  int iteration_ = 0;
  bool backward_ = false;
  size_t layer_ = 0;
  bool computing_ = false;
  Nanos step_start_ = 0;
  bool finished_ = false;
  std::vector<uint32_t> layer_pending_;  // unfinished tasks per layer, from the previous iteration

  std::vector<TaskState> tasks_;  // by task id
  std::vector<Batch> batches_;
  std::vector<Nanos> batch_start_;
  std::vector<PartRef> parts_scratch_;
};

void Run::record(Span::Lane lane, int iteration, Nanos start, Nanos end, int32_t first, int32_t last, uint64_t bytes,
                 uint32_t parts) {
  if (opt_.record_timeline) result_.spans.push_back({lane, iteration, start, end, first, last, bytes, parts});
}

// Starts the next compute step if the stream is idle and the step's inputs are there.
void Run::try_start_compute(Nanos now) {
  if (computing_ || finished_) return;
  const LayerProfile& l = model_.layers[layer_];
  if (!backward_) {
    if (layer_pending_[layer_] > 0) return;  // this layer's parameters are still being synchronised
    if (layer_ == 0) {
      result_.iteration_start_s.push_back(now * 1e-9);
      if (iteration_ == opt_.iterations) {  // one past the last: only its start matters
        finished_ = true;
        return;
      }
    }
  }
  computing_ = true;
  step_start_ = now;
  schedule(now + (backward_ ? l.backward : l.forward), Event::Kind::compute_done);
}

void Run::on_compute_done(Nanos now) {
  computing_ = false;
  const auto lane = backward_ ? Span::Lane::backward : Span::Lane::forward;
  record(lane, iteration_, step_start_, now, int32_t(layer_), int32_t(layer_), 0, 0);
  if (!backward_) {
    if (layer_ + 1 < model_.layers.size()) {
      ++layer_;
    } else {
      backward_ = true;  // the last layer's backward follows its forward
    }
  } else {
    submit_layer(layer_, now);
    if (layer_ > 0) {
      --layer_;
    } else {
      policy_.on_backward_done(now);
      backward_ = false;
      ++iteration_;
    }
  }
  pump(now);
  try_start_compute(now);
}

void Run::submit_layer(size_t layer, Nanos now) {
  const bool split = policy_.splits_tasks();
  for (size_t t : model_.layers[layer].tensors) {
    const TensorProfile& tp = model_.tensors[t];
    const uint64_t id = tasks_.size();
    const auto ranges = partition_ranges(tp.elements, tp.dtype, split ? opt_.partition_bytes : 0);
    if (ranges.empty()) continue;
    parts_scratch_.clear();
    for (uint32_t i = 0; i < ranges.size(); ++i)
      parts_scratch_.push_back({id, i, int32_t(t), id, ranges[i].offset, ranges[i].bytes});
    tasks_.push_back({layer, iteration_, uint32_t(ranges.size())});
    ++layer_pending_[layer];
    policy_.on_task_arrived({id, int32_t(t), id, tp.bytes(), parts_scratch_}, now);
  }
}

// The push has arrived (PS receipt) or the whole exchange is over: the engine releases the batch's credit here
// (scheduler/engine.cc, on_batch_sent), so the policy hears on_batch_done now, not when the result is back.
void Run::on_batch_sent(size_t index, Nanos now) {
  policy_.on_batch_done(batches_[index], now);
  pump(now);
  try_start_compute(now);
}

void Run::on_batch_done(size_t index, Nanos now) {
  const Batch& b = batches_[index];
  record(Span::Lane::comm, tasks_[b.front().task_id].iteration, batch_start_[index], now, b.front().priority, b.back().priority, batch_bytes(b),
         uint32_t(b.size()));
  for (const PartRef& p : b) {
    TaskState& t = tasks_.at(p.task_id);
    if (--t.parts_left == 0) --layer_pending_[t.layer];
  }
  pump(now);
  try_start_compute(now);
}

// Asks the policy what to send now, sends it, and arranges the next wake-up it asks for.
void Run::pump(Nanos now) {
  std::vector<Batch> out;
  for (int guard = 0; guard < 2; ++guard) {
    out.clear();
    policy_.poll(now, out);
    for (Batch& b : out) {
      if (b.empty()) continue;
      const Transfer t = net_.transfer(b, now);
      batches_.push_back(std::move(b));
      batch_start_.push_back(t.begin);  // the timeline shows time on the wire, not time queued behind others
      schedule(t.released(), Event::Kind::batch_sent, batches_.size() - 1);  // scheduled first: runs first on ties
      schedule(t.end, Event::Kind::batch_done, batches_.size() - 1);
    }
    const auto wake = policy_.next_wakeup();
    if (!wake) return;
    if (*wake > now) {
      if (!wake_scheduled_ || *wake < *wake_scheduled_) {
        wake_scheduled_ = *wake;
        schedule(*wake, Event::Kind::wakeup);
      }
      return;
    }
  }
  // A policy that keeps asking for "now" without dispatching: look again a nanosecond later rather than spin.
  schedule(now + 1, Event::Kind::wakeup);
}

SimResult Run::go() {
  if (opt_.iterations < 1 || opt_.warmup < 0 || opt_.warmup >= opt_.iterations)
    throw InvalidArgument("simulate: need iterations >= 1 and 0 <= warmup < iterations, got " +
                          std::to_string(opt_.iterations) + " and " + std::to_string(opt_.warmup));
  if (model_.layers.empty()) throw InvalidArgument("simulate: profile '" + model_.name + "' has no layers");
  net_.reset();
  result_.policy = std::string(policy_.name());
  try_start_compute(0);
  // After the last iteration's start the compute stops; the queue still drains so its communication is recorded.
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    switch (e.kind) {
      case Event::Kind::compute_done: on_compute_done(e.time); break;
      case Event::Kind::batch_sent: on_batch_sent(e.index, e.time); break;
      case Event::Kind::batch_done: on_batch_done(e.index, e.time); break;
      case Event::Kind::wakeup:
        if (wake_scheduled_ && *wake_scheduled_ <= e.time) wake_scheduled_.reset();
        pump(e.time);
        try_start_compute(e.time);
        break;
    }
  }
  if (!finished_)
    throw InvalidArgument("simulate: policy '" + result_.policy + "' stalled in iteration " +
                          std::to_string(iteration_) + " with " + std::to_string(policy_.queued_partitions()) +
                          " partitions queued and nothing in flight");
  const auto& s = result_.iteration_start_s;
  result_.iteration_s = (s[opt_.iterations] - s[opt_.warmup]) / (opt_.iterations - opt_.warmup);
  result_.compute_s = model_.compute_per_iteration() * 1e-9;
  result_.comm_bound_s = net_.comm_lower_bound_s(model_.total_bytes());
  result_.lower_bound_s = std::max(result_.compute_s, result_.comm_bound_s);
  result_.dependency_bound_s = dependency_bound_s(model_, net_);
  result_.batches = batches_.size();
  return result_;
}

}  // namespace

double dependency_bound_s(const ModelProfile& model, const NetworkModel& network) {
  const double compute = model.compute_per_iteration() * 1e-9;
  double bound = std::max(compute, network.comm_lower_bound_s(model.total_bytes()));
  uint64_t bytes = 0;      // gradients of layers 0..i
  double overlap = 0;      // backward + forward of layers 0..i-1, in seconds
  for (const LayerProfile& l : model.layers) {
    for (size_t t : l.tensors) bytes += model.tensors[t].bytes();
    bound = std::max(bound, compute + network.comm_lower_bound_s(bytes) - overlap);
    overlap += (l.forward + l.backward) * 1e-9;
  }
  return bound;
}

SimResult simulate(const ModelProfile& model, NetworkModel& network, Policy& policy, const SimOptions& options) {
  return Run(model, network, policy, options).go();
}

}  // namespace commsched::sim
