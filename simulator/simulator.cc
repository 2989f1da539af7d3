#include "simulator/simulator.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>

#include "simulator/fabric.h"
#include "simulator/ps_cluster.h"
#include "scheduler/policy_driver.h"
#include "scheduler/task.h"

namespace commsched::sim {
namespace {

struct TaskState {
  size_t layer;
  int iteration;
  uint32_t parts_left;
};

// A NetworkModel knows at dispatch when a batch completes (symmetric workers): one representative worker.
class ModelFabric final : public Fabric {
 public:
  explicit ModelFabric(NetworkModel& net) : net_(net) {}
  int simulated_workers() const override { return 1; }
  void start(EventLoop& loop, BatchSink& sink) override {
    net_.reset();
    loop_ = &loop;
    sink_ = &sink;
  }
  Nanos dispatch(int worker, size_t id, const Batch& batch, Nanos now) override {
    const Transfer t = net_.transfer(batch, now);
    loop_->post(t.released(), [](void* f, uint64_t w, uint64_t b) {
      auto& self = *static_cast<ModelFabric*>(f);
      self.sink_->batch_sent(int(w), size_t(b), self.loop_->now());
    }, this, uint64_t(worker), id);
    loop_->post(t.end, [](void* f, uint64_t w, uint64_t b) {
      auto& self = *static_cast<ModelFabric*>(f);
      self.sink_->batch_done(int(w), size_t(b), self.loop_->now());
    }, this, uint64_t(worker), id);
    return t.begin;
  }

 private:
  NetworkModel& net_;
  EventLoop* loop_ = nullptr;
  BatchSink* sink_ = nullptr;
};

class Run;

// One worker: its compute stream, its policy (driven by the engine's loop, scheduler/policy_driver.h) and the batches
// it dispatched.
class Worker final : public DispatchSink {
 public:
  Worker(Run& run, int rank, Policy& policy) : run_(run), rank_(rank), driver_(policy) {}

  void try_start_compute(Nanos now);
  void on_batch_sent(size_t index, Nanos now);
  void on_batch_done(size_t index, Nanos now);
  void pump(Nanos now);

  bool finished() const { return finished_; }
  int iteration() const { return iteration_; }
  // No earlier than this, seen at `now`, can the worker start the iteration one past the last: what is left of its
  // compute runs one step after another, and the pushes its iterations before the last still owe must cross its
  // uplink first (Run::period_lower_bound).
  Nanos last_start_lower_bound(Nanos now) const;
  const Policy& policy() const { return driver_.policy(); }
  uint64_t batches() const { return dispatched_; }
  const std::vector<double>& iteration_starts() const { return starts_; }

 private:
  void on_compute_done(Nanos now);
  void submit_layer(size_t layer, Nanos now);
  bool dispatch(Batch& batch, Nanos now) override;
  void record(Span::Lane lane, int iteration, Nanos start, Nanos end, int32_t first, int32_t last, uint64_t bytes,
              uint32_t parts);

  Run& run_;
  const int rank_;
  PolicyDriver driver_;
  std::optional<Nanos> wake_scheduled_;

  // Compute stream: iteration, phase and layer of the next (or running) step.
  int iteration_ = 0;
  bool backward_ = false;
  size_t layer_ = 0;
  bool computing_ = false;
  Nanos step_start_ = 0;
  bool finished_ = false;
  std::vector<uint32_t> layer_pending_;  // unfinished tasks per layer, from the previous iteration
  std::vector<double> starts_;           // seconds

  // Dispatched so far of the tasks of the iterations before the last (they must all be done before it ends).
  uint64_t owed_bytes_sent_ = 0, owed_parts_sent_ = 0;
  // The first task of the last iteration (task ids follow the iterations): the tasks before it are owed. Read by
  // dispatch instead of each task's state, which with hundreds of workers is out of the cache.
  uint64_t first_of_last_iteration_ = UINT64_MAX;

  std::vector<TaskState> tasks_;  // by task id
  // The batches in flight by id. An id is free again once its batch is done (the fabric reports nothing of it after
  // that), so a long run with many workers and small partitions holds what is in flight, not its history.
  std::vector<Batch> batches_;
  std::vector<Nanos> batch_start_;
  std::vector<size_t> free_ids_;
  uint64_t dispatched_ = 0;
  std::vector<PartRef> parts_scratch_;
};

class Run final : public BatchSink {
 public:
  Run(const ModelProfile& m, Fabric& f, std::vector<Policy*> policies, const SimOptions& o)
      : model_(m), fabric_(f), opt_(o) {
    workers_.reserve(policies.size());
    for (size_t w = 0; w < policies.size(); ++w) {
      if (policies[w]->splits_tasks() != policies.front()->splits_tasks())
        throw InvalidArgument("simulate: worker " + std::to_string(w) + "'s policy '" +
                              std::string(policies[w]->name()) + "' splits tasks unlike worker 0's");
      workers_.emplace_back(*this, int(w), *policies[w]);
      hot_.push_back({nullptr, policies[w]});
    }
    measure_iteration(policies.front()->splits_tasks());
  }

  SimResult go(const NetworkModel& bounds);

  void batch_sent(int worker, size_t id, Nanos now) override { workers_[size_t(worker)].on_batch_sent(id, now); }
  void batch_done(int worker, size_t id, Nanos now) override { workers_[size_t(worker)].on_batch_done(id, now); }
  // What on_batch_sent and on_batch_done read first: with hundreds of workers it is out of the cache by then. Every
  // address comes from this small array, not from the worker, whose line is one of the misses to hide; reading the
  // slot to prefetch the batch's parts too would wait on the miss this is to hide.
  void upcoming(int worker, size_t id) override {
    const HotLines& h = hot_[size_t(worker)];
    __builtin_prefetch(h.batches + id);
    __builtin_prefetch(&workers_[size_t(worker)]);
    __builtin_prefetch(h.policy);
    __builtin_prefetch(static_cast<const char*>(h.policy) + 64);
  }
  // Worker `worker`'s batch slots moved (they grew).
  void batches_moved(int worker, const Batch* slots) { hot_[size_t(worker)].batches = slots; }
  // Keeps the lower bound of the mean period that abandoning a run needs; stops the loop once it is above the limit.
  void on_iteration_start(Nanos now);

 private:
  friend class Worker;
  // What one iteration asks of every worker, whatever the schedule: its compute steps (forward of each layer, then
  // backward of each in reverse; rest_[k] is the compute of steps k.. to the iteration's end, rest_[0] all of it),
  // and the bytes and partitions it pushes. `splits`: the policies split tasks (the same kind on every worker).
  void measure_iteration(bool splits);
  std::vector<std::vector<ByteRange>> ranges_;  // per tensor, its partitions (the same in every iteration)
  // The mean period over the workers, as go() computes it, with each worker's still unknown start of the iteration
  // one past the last replaced by a lower bound of it (Worker::last_start_lower_bound), and a worker not yet measuring
  // charged what its measured iterations need at least. Each term is at most the period go() would report, so the
  // mean is too (rounding to nearest is monotone): abandoning on it never drops a run that would come out below the
  // limit.
  double period_lower_bound(Nanos now) const;
  Nanos min_measured_span() const;  // the least time from the first measured start to the one past the last
  std::vector<Nanos> rest_;
  uint64_t bytes_per_iteration_ = 0, parts_per_iteration_ = 0;
  bool abandoned_ = false;
  const ModelProfile& model_;
  Fabric& fabric_;
  const SimOptions& opt_;
  EventLoop loop_;
  std::vector<Worker> workers_;
  struct HotLines {  // per worker: where upcoming() prefetches
    const Batch* batches = nullptr;
    const void* policy = nullptr;
  };
  std::vector<HotLines> hot_;
  std::vector<Span> spans_;  // worker 0's
};

void Worker::record(Span::Lane lane, int iteration, Nanos start, Nanos end, int32_t first, int32_t last,
                    uint64_t bytes, uint32_t parts) {
  if (run_.opt_.record_timeline && rank_ == 0)
    run_.spans_.push_back({lane, iteration, start, end, first, last, bytes, parts});
}

// Starts the next compute step if the stream is idle and the step's inputs are there.
void Worker::try_start_compute(Nanos now) {
  if (computing_ || finished_) return;
  const ModelProfile& model = run_.model_;
  if (layer_pending_.empty()) layer_pending_.assign(model.layers.size(), 0);
  const LayerProfile& l = model.layers[layer_];
  if (!backward_) {
    if (layer_pending_[layer_] > 0) return;  // this layer's parameters are still being synchronised
    if (layer_ == 0) {
      starts_.push_back(now * 1e-9);
      run_.on_iteration_start(now);
      if (iteration_ == run_.opt_.iterations) {  // one past the last: only its start matters
        finished_ = true;
        return;
      }
    }
  }
  computing_ = true;
  step_start_ = now;
  run_.loop_.post(now + (backward_ ? l.backward : l.forward), [](void* w, uint64_t, uint64_t) {
    auto& self = *static_cast<Worker*>(w);
    self.on_compute_done(self.run_.loop_.now());
  }, this);
}

void Worker::on_compute_done(Nanos now) {
  computing_ = false;
  const auto lane = backward_ ? Span::Lane::backward : Span::Lane::forward;
  record(lane, iteration_, step_start_, now, int32_t(layer_), int32_t(layer_), 0, 0);
  if (!backward_) {
    if (layer_ + 1 < run_.model_.layers.size()) {
      ++layer_;
    } else {
      backward_ = true;  // the last layer's backward follows its forward
    }
  } else {
    submit_layer(layer_, now);
    if (layer_ > 0) {
      --layer_;
    } else {
      driver_.backward_done(now);
      backward_ = false;
      ++iteration_;
    }
  }
  pump(now);
  try_start_compute(now);
}

void Worker::submit_layer(size_t layer, Nanos now) {
  const ModelProfile& model = run_.model_;
  for (size_t t : model.layers[layer].tensors) {
    const TensorProfile& tp = model.tensors[t];
    const uint64_t id = tasks_.size();
    const std::vector<ByteRange>& ranges = run_.ranges_[t];
    if (ranges.empty()) continue;
    parts_scratch_.clear();
    for (uint32_t i = 0; i < ranges.size(); ++i)
      parts_scratch_.push_back({id, i, int32_t(t), id, ranges[i].offset, ranges[i].bytes});
    if (iteration_ == run_.opt_.iterations - 1) first_of_last_iteration_ = std::min(first_of_last_iteration_, id);
    tasks_.push_back({layer, iteration_, uint32_t(ranges.size())});
    ++layer_pending_[layer];
    driver_.arrived({id, int32_t(t), id, tp.bytes(), parts_scratch_}, now);
  }
}

// The push has arrived (PS receipt) or the whole exchange is over: the engine releases the batch's credit here
// (scheduler/engine.cc, on_batch_sent), so the policy hears on_batch_done now, not when the result is back.
void Worker::on_batch_sent(size_t index, Nanos now) {
  driver_.batch_done(batches_[index], now);
  pump(now);
  try_start_compute(now);
}

void Worker::on_batch_done(size_t index, Nanos now) {
  const Batch& b = batches_[index];
  if (run_.opt_.record_timeline)
    record(Span::Lane::comm, tasks_[b.front().task_id].iteration, batch_start_[index], now, b.front().priority,
           b.back().priority, batch_bytes(b), uint32_t(b.size()));
  for (const PartRef& p : b) {
    TaskState& t = tasks_.at(p.task_id);
    if (--t.parts_left == 0) --layer_pending_[t.layer];
  }
  // Its last use (receipts come first). Its buffer is freed now, while the cache holds it, rather than when the id
  // is reused, when freeing it would miss.
  Batch().swap(batches_[index]);
  free_ids_.push_back(index);
  pump(now);
  try_start_compute(now);
}

bool Worker::dispatch(Batch& batch, Nanos now) {
  for (const PartRef& p : batch)
    if (p.task_id < first_of_last_iteration_) owed_bytes_sent_ += p.bytes, ++owed_parts_sent_;
  size_t id = batches_.size();
  if (free_ids_.empty()) {
    batches_.emplace_back();
    batch_start_.push_back(0);
    run_.batches_moved(rank_, batches_.data());
  } else {
    id = free_ids_.back();
    free_ids_.pop_back();
  }
  batches_[id] = std::move(batch);
  ++dispatched_;
  // The timeline shows time on the wire, not time queued behind others.
  batch_start_[id] = run_.fabric_.dispatch(rank_, id, batches_[id], now);
  return true;
}

// Sends what the policy dispatches now and arranges the next wake-up it asks for.
void Worker::pump(Nanos now) {
  auto wake_up = [this](Nanos at) {
    run_.loop_.post(at, [](void* w, uint64_t, uint64_t) {
      auto& self = *static_cast<Worker*>(w);
      const Nanos at = self.run_.loop_.now();
      if (self.wake_scheduled_ && *self.wake_scheduled_ <= at) self.wake_scheduled_.reset();
      self.pump(at);
      self.try_start_compute(at);
    }, this);
  };
  const std::optional<Nanos> wake = driver_.pump(now, *this);
  if (!wake) return;
  if (*wake <= now) {  // a policy that keeps asking for "now" without dispatching: look again a nanosecond later
    wake_up(now + 1);
  } else if (!wake_scheduled_ || *wake < *wake_scheduled_) {
    wake_scheduled_ = *wake;
    wake_up(*wake);
  }
}

// Iteration n (one past the last) starts only once the last iteration's forward and backward have run, and that
// forward waits, layer by layer, for every task of the iterations before it. So each of their bytes must have crossed
// the worker's uplink first, and after the last of them at least the last layer's forward and a whole backward run.
Nanos Worker::last_start_lower_bound(Nanos now) const {
  const size_t layers = run_.model_.layers.size();
  const size_t step = backward_ ? 2 * layers - 1 - layer_ : layer_;  // the running step, or the next one
  const Nanos compute = (computing_ ? step_start_ : now) + run_.rest_[step] +
                        Nanos(run_.opt_.iterations - 1 - iteration_) * run_.rest_[0];
  const uint64_t owed = uint64_t(run_.opt_.iterations - 1);
  const uint64_t owed_bytes = owed * run_.bytes_per_iteration_ - owed_bytes_sent_;
  if (owed_bytes == 0) return compute;
  const Nanos push = run_.fabric_.min_push_ns(owed_bytes, owed * run_.parts_per_iteration_ - owed_parts_sent_);
  return std::max(compute, now + push + run_.rest_[layers - 1]);  // from the last layer's forward on
}

void Run::measure_iteration(bool splits) {
  const size_t layers = model_.layers.size();
  rest_.assign(2 * layers + 1, 0);
  for (size_t k = 2 * layers; k-- > 0;)
    rest_[k] = rest_[k + 1] + (k < layers ? model_.layers[k].forward : model_.layers[2 * layers - 1 - k].backward);
  ranges_.clear();
  for (const TensorProfile& tp : model_.tensors)
    ranges_.push_back(partition_ranges(tp.elements, tp.dtype, splits ? opt_.partition_bytes : 0));
  for (const LayerProfile& l : model_.layers)  // what submit_layer submits
    for (size_t t : l.tensors) {
      bytes_per_iteration_ += model_.tensors[t].bytes();
      parts_per_iteration_ += ranges_[t].size();
    }
}

Nanos Run::min_measured_span() const {
  const int measured = opt_.iterations - opt_.warmup;
  const uint64_t owed = uint64_t(measured - 1);  // the measured iterations but the last: produced after the first start
  return std::max(Nanos(measured) * rest_[0],
                  fabric_.min_push_ns(owed * bytes_per_iteration_, owed * parts_per_iteration_));
}

double Run::period_lower_bound(Nanos now) const {
  const int n = opt_.iterations, warmup = opt_.warmup;
  const double not_measuring = double(min_measured_span()) * 1e-9 / (n - warmup);
  double sum = 0;  // in go()'s order and form, term by term
  for (const Worker& w : workers_) {
    const std::vector<double>& s = w.iteration_starts();
    if (s.size() > size_t(n))  // its period is known
      sum += (s[size_t(n)] - s[size_t(warmup)]) / (n - warmup);
    else if (s.size() > size_t(warmup))
      sum += (double(w.last_start_lower_bound(now)) * 1e-9 - s[size_t(warmup)]) / (n - warmup);
    else
      sum += not_measuring;
  }
  return sum / double(workers_.size());
}

void Run::on_iteration_start(Nanos now) {
  if (!(opt_.abandon_above_s > 0)) return;
  if (period_lower_bound(now) > opt_.abandon_above_s) {
    abandoned_ = true;
    loop_.stop();
  }
}

SimResult Run::go(const NetworkModel& bounds) {
  if (opt_.iterations < 1 || opt_.warmup < 0 || opt_.warmup >= opt_.iterations)
    throw InvalidArgument("simulate: need iterations >= 1 and 0 <= warmup < iterations, got " +
                          std::to_string(opt_.iterations) + " and " + std::to_string(opt_.warmup));
  if (model_.layers.empty()) throw InvalidArgument("simulate: profile '" + model_.name + "' has no layers");
  fabric_.start(loop_, *this);
  SimResult result;
  result.policy = std::string(workers_.front().policy().name());
  for (Worker& w : workers_) w.try_start_compute(0);
  // After the last iteration's start the compute stops; the queue still drains so its communication is recorded.
  loop_.run();
  result.iteration_start_s = workers_.front().iteration_starts();
  result.compute_s = model_.compute_per_iteration() * 1e-9;
  result.comm_bound_s = comm_bound_s(model_, model_.layers.size(), bounds);
  result.lower_bound_s = std::max(result.compute_s, result.comm_bound_s);
  result.dependency_bound_s = dependency_bound_s(model_, bounds);
  result.batches = workers_.front().batches();
  result.spans = std::move(spans_);
  result.links = fabric_.link_use(loop_.now());  // the whole run: warm-up and the final drain included
  if (abandoned_) {
    result.abandoned = true;
    result.iteration_s = period_lower_bound(loop_.now());
    return result;
  }
  for (size_t i = 0; i < workers_.size(); ++i)
    if (!workers_[i].finished())
      throw InvalidArgument("simulate: policy '" + result.policy + "' stalled" +
                            (workers_.size() > 1 ? " on worker " + std::to_string(i) : std::string()) +
                            " in iteration " + std::to_string(workers_[i].iteration()) + " with " +
                            std::to_string(workers_[i].policy().queued_partitions()) +
                            " partitions queued and nothing in flight");
  // The mean of every worker's period. Coupled workers share the period in the long run, but over a few iterations
  // the one served first can pull ahead (its own period reads short) while the last falls behind.
  for (const Worker& w : workers_) {
    const auto& s = w.iteration_starts();
    result.iteration_s += (s[opt_.iterations] - s[opt_.warmup]) / (opt_.iterations - opt_.warmup);
  }
  result.iteration_s /= double(workers_.size());
  return result;
}

}  // namespace

double comm_bound_s(const ModelProfile& model, size_t layers, const NetworkModel& network) {
  uint64_t bytes = 0, messages = 0;
  for (size_t i = 0; i < layers; ++i)
    for (size_t t : model.layers[i].tensors) {
      bytes += model.tensors[t].bytes();
      messages += network.min_messages(model.tensors[t].bytes());
    }
  return network.comm_lower_bound_s(bytes, messages);
}

double dependency_bound_s(const ModelProfile& model, const NetworkModel& network) {
  const double compute = model.compute_per_iteration() * 1e-9;
  double bound = std::max(compute, comm_bound_s(model, model.layers.size(), network));
  double overlap = 0;      // backward + forward of layers 0..i-1, in seconds
  for (size_t i = 0; i < model.layers.size(); ++i) {
    bound = std::max(bound, compute + comm_bound_s(model, i + 1, network) - overlap);
    overlap += (model.layers[i].forward + model.layers[i].backward) * 1e-9;
  }
  return bound;
}

SimResult simulate(const ModelProfile& model, NetworkModel& network, Policy& policy, const SimOptions& options) {
  ModelFabric fabric(network);
  return Run(model, fabric, {&policy}, options).go(network);
}

SimResult simulate_each_worker(const ModelProfile& model, const PsParams& params, const PolicyFactory& make_policy,
                               const SimOptions& options, const CompressionModel& compression) {
  PsClusterFabric fabric(params, compression);
  std::vector<std::unique_ptr<Policy>> owned;
  std::vector<Policy*> policies;
  for (int w = 0; w < fabric.simulated_workers(); ++w) {
    owned.push_back(make_policy());
    policies.push_back(owned.back().get());
  }
  const auto bounds = with_compression(std::make_unique<PsNetwork>(params), compression, params.workers);
  return Run(model, fabric, std::move(policies), options).go(*bounds);
}

}  // namespace commsched::sim
