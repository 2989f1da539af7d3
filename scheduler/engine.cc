// The engine's public calls and the admission of a task; the scheduler node is in engine_loop.cc, the state both
// share in engine_impl.h.
#include "scheduler/engine.h"

#include <cstdio>
#include <thread>

#include "scheduler/engine_impl.h"
#include "scheduler/engine_trace.h"
#include "scheduler/forward_policy.h"
#include "scheduler/global_order.h"
#include "scheduler/stages/compression_stage.h"

namespace commsched {
namespace {

// Tasks with more partitions than this are partitioned on the flow graph's parallel node instead of inline.
constexpr uint32_t kInlinePartitionLimit = 64;

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

Engine::Impl::Impl(std::unique_ptr<Policy> p, std::shared_ptr<CommBackend> b, EngineConfig c,
                   std::vector<std::shared_ptr<Stage>> extra)
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

void Engine::Impl::post_done(uint64_t id, const Status& s) {
  Event e;
  e.kind = Event::Kind::batch_done;
  e.id = id;
  e.status = s;
  events.push(std::move(e));
}

void Engine::Impl::partition_and_post(TaskState* t) {
  try {
    const uint64_t pbytes = splits ? active_partition_bytes.load(std::memory_order_relaxed) : 0;
    t->parts.reserve(partition_count(t->desc.count, t->desc.dtype, pbytes));
    for_each_partition(t->desc.count, t->desc.dtype, pbytes, [t](uint32_t i, ByteRange r) {
      t->parts.push_back(PartRef{t->desc.id, i, t->desc.priority, t->desc.id, r.offset, r.bytes});
    });
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
// a host-only backend carry CUDA tensors). `carries`: the backend's capability row, asked once (this runs on every
// submit).
void check_route(const TaskDesc& t, const std::vector<std::shared_ptr<Stage>>& stages, const CommBackend& backend,
                 const OpDeviceSet& carries) {
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
  if (carries.has(t.op, at)) return;
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
  check_route(t->desc, m.graph.stages(), *m.backend, m.caps.carries);
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
  Impl::Event mark;
  mark.kind = Impl::Event::Kind::backward_done;
  mark.id = submitted;
  m.post(std::move(mark));
  Impl::Event kn;
  kn.kind = Impl::Event::Kind::knobs;
  kn.knobs = k;
  m.post(std::move(kn));
  if (m.timeline) {
    trace_stragglers(*m.timeline, m.now(), m.caps.stragglers ? m.caps.stragglers->stragglers() : std::vector<Straggler>{});
    trace_backward_done(*m.timeline, m.now(), m.iteration.load(), k);
  }
}

void Engine::flush() {
  Impl& m = *impl_;
  if (m.closed.load()) return;
  Impl::Event mark;
  mark.kind = Impl::Event::Kind::flush;
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
  const int last = m.caps.joins->join();
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
  Impl::Event e;
  e.kind = Impl::Event::Kind::shutdown;
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
Engine::Helper Engine::wait_helper() const {
  if (!impl_->caps.wait_helper) return {};
  return {impl_->caps.wait_helper, impl_->backend};
}
Nanos Engine::now() const { return impl_->now(); }

}  // namespace commsched
