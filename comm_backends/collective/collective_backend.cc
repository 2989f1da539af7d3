#include "comm_backends/collective/collective_backend.h"

#include <pthread.h>

#include <algorithm>
#include <sstream>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/control/socket.h"
#include "scheduler/config.h"

namespace commsched::collective {

const OptionTable<CollectiveOptions>& CollectiveOptions::table() {
  static const OptionTable<CollectiveOptions> t = [] {
    OptionTable<CollectiveOptions> t("collective", "collective");
    t.bind("collective_fusion_bytes", "COMMSCHED_COLLECTIVE_FUSION_BYTES",
           [](CollectiveOptions& o) -> uint64_t& { return o.fusion_bytes; }, size_value(ZeroSize::unlimited),
           "all-reduce: the bytescheduler small-tensor fusion bound on rank 0's coordinator when COMMSCHED_SMALL_TENSOR_BYTES sets none");
    t.bind("collective_credit_bytes", "COMMSCHED_COLLECTIVE_CREDIT_BYTES",
           [](CollectiveOptions& o) -> uint64_t& { return o.credit_bytes; }, size_value(ZeroSize::unlimited),
           "all-reduce: the global credit kept on rank 0 until an engine hands over its credit knob");
    t.bind("collective_spin", "COMMSCHED_COLLECTIVE_SPIN", [](CollectiveOptions& o) -> double& { return o.spin_s; },
           duration_value(),
           "all-reduce: how long the order negotiation polls without sleeping before it sleeps (0: sleep at once)");
    t.bind("collective_vouch", "COMMSCHED_COLLECTIVE_VOUCH", [](CollectiveOptions& o) -> bool& { return o.vouch; },
           bool_value(),
           "all-reduce: rank 0 orders a partition every rank ran before as soon as it is ready there, without waiting "
           "for the others' reports (0: wait for every rank's)");
    return t;
  }();
  return t;
}

CollectiveOptions CollectiveOptions::from_env() {
  CollectiveOptions o;
  table().set_from_env(o);
  o.stall = StallOptions::from_env();
  o.policy = EngineConfig::from_env();  // the engines' configuration: what a fusion bound of 0 means on rank 0
  return o;
}

NegotiatorOptions CollectiveOptions::negotiator_options(const ClusterEnv& env) const {
  NegotiatorOptions o;
  o.rank = env.rank;
  o.size = env.num_workers;
  o.timeout_s = env.timeout_s;
  o.join_timeout_s = join_timeout_s(env.timeout_s);
  // A collective pays a call's latency that a parameter server's pipelined pushes hide, so on a collective
  // bytescheduler fuses small tensors up to the collective fusion size by default.
  if (policy.policy == PolicyKind::bytescheduler) o.auto_fusion_bytes = fusion_bytes;
  o.knobs = policy.knobs;
  o.knobs.credit_bytes = credit_bytes;
  o.spin_s = spin_s;
  o.vouch = vouch;
  o.stall = stall;
  o.host = env.rank == 0 ? env.root_addr : control::advertised_host(env);
  o.secret = ClusterAuth::from_env().secret_for(env.root_addr);  // the rendezvous store's rule: one answer per run
  return o;
}

CollectiveBackend::CollectiveBackend(int rank, int size) : rank_(rank), size_(size) {}

CollectiveBackend::~CollectiveBackend() { stop_base(); }

void CollectiveBackend::start_negotiation(NegotiatorOptions opts, control::Store& store, bool execute_on_negotiator_thread) {
  opts.execute_blocks = execute_on_negotiator_thread && size_ > 1;
  NegotiatorCallbacks cb;
  if (opts.execute_blocks) cb.execute = [this](std::vector<uint64_t>&& group) { execute_inline(std::move(group)); };
  else cb.execute = [this](std::vector<uint64_t>&& group) { enqueue(std::move(group)); };
  cb.fail = [this](uint64_t token, const Status& st) { complete(token, st); };
  cb.fatal = [this](const Status& st) { fatal(st); };
  cb.stand_in = [this](const PartitionDesc& d) { return stand_in(d); };
  negotiator_ = std::make_unique<Negotiator>(opts, store, std::move(cb));
  if (!opts.execute_blocks) executor_ = std::thread([this] { executor_loop(); });  // queued groups wait for it
}

void CollectiveBackend::execute_inline(std::vector<uint64_t>&& group) { run_group(std::move(group)); }

uint64_t CollectiveBackend::stand_in(const PartitionDesc& d) {
  struct Zeros {
    TaskDesc task;
    std::vector<std::byte> data;
  };
  auto z = std::make_shared<Zeros>();
  z->data.assign(std::max<uint64_t>(d.bytes, 1), std::byte{0});
  z->task.name = "join stand-in for key " + std::to_string(d.key);
  z->task.key = d.key;
  z->task.op = d.op;
  z->task.dtype = d.dtype;
  z->task.root = d.root;
  z->task.count = d.bytes / dtype_size(d.dtype);
  z->task.buffer.data = z->data.data();
  auto state = std::make_shared<BatchState>();
  state->remaining = 1;
  state->done = [z](const Status&) {};  // the zeros live until the collective is done
  std::lock_guard lock(mu_);
  const uint64_t token = next_token_++;
  items_.emplace(token, Item{PartitionView{&z->task, 0, 0, d.bytes}, std::move(state)});
  return token;
}

std::string CollectiveBackend::check(const PartitionView& p) const {
  const TaskDesc* t = p.task;
  if (t == nullptr) return "partition without a task";
  std::ostringstream os;
  os << name() << " backend, task '" << t->name << "': ";
  if (!supports(t->op, t->buffer.device))
    os << "cannot carry " << op_name(t->op) << " on " << (t->buffer.device == Device::cpu ? "CPU" : "CUDA") << " buffers";
  else if (t->op == Op::broadcast && (t->root < 0 || t->root >= size_))
    os << "broadcast root " << t->root << " is not a rank of this group of " << size_;
  else if (p.offset + p.bytes > t->bytes())
    os << "partition [" << p.offset << ", " << p.offset + p.bytes << ") exceeds the " << t->bytes() << "-byte tensor";
  else if (p.bytes % dtype_size(t->dtype) != 0 || p.offset % dtype_size(t->dtype) != 0)
    os << "partition [" << p.offset << ", " << p.offset + p.bytes << ") is not aligned to " << dtype_name(t->dtype);
  else
    return {};
  return os.str();
}

Submission CollectiveBackend::submission(uint64_t token, const PartitionView& p) const {
  const TaskDesc& t = *p.task;
  Submission s;
  s.token = token;
  s.desc = PartitionDesc{t.key, p.offset, p.bytes, t.bytes(), t.dtype, t.op, t.op == Op::broadcast ? t.root : 0};
  s.name = t.name;
  s.round = t.round;
  s.priority = t.priority;
  return s;
}

void CollectiveBackend::do_start(std::vector<PartitionView> batch, BatchDone /*sent*/, BatchDone done) {
  for (const auto& p : batch)
    if (std::string why = check(p); !why.empty()) {
      done(Status::Error(why, Status::Code::invalid));
      return;
    }
  if (batch.empty()) {
    done(Status::Ok());
    return;
  }
  auto state = std::make_shared<BatchState>();
  state->done = std::move(done);
  state->remaining = batch.size();
  std::vector<Submission> subs;
  subs.reserve(batch.size());
  {
    std::unique_lock lock(mu_);
    if (!accepting_ || !fatal_.ok()) {
      const Status st = fatal_.ok() ? Status::Error(std::string(name()) + " backend is shut down", Status::Code::cancelled) : fatal_;
      lock.unlock();
      state->done(st);
      return;
    }
    for (const auto& p : batch) {
      const uint64_t token = next_token_++;
      items_.emplace(token, Item{p, state});
      subs.push_back(submission(token, p));
    }
  }
  negotiator_->submit(std::move(subs));
}

void CollectiveBackend::complete(uint64_t token, const Status& st) {
  BatchDone done;
  Status result;
  {
    std::lock_guard lock(mu_);
    auto it = items_.find(token);
    if (it == items_.end()) return;
    auto batch = std::move(it->second.batch);
    items_.erase(it);
    if (!st.ok() && batch->status.ok()) batch->status = st;  // the first error explains the batch
    if (--batch->remaining > 0) return;
    done = std::move(batch->done);
    result = std::move(batch->status);
  }
  done(result);
}

void CollectiveBackend::enqueue(std::vector<uint64_t>&& group) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(group));
  }
  cv_.notify_one();
}

void CollectiveBackend::fatal(const Status& st) {
  {
    std::lock_guard lock(mu_);
    if (fatal_.ok()) fatal_ = st;
  }
  on_fatal(st);
  cv_.notify_one();
}

void CollectiveBackend::executor_loop() {
  ::pthread_setname_np(::pthread_self(), "cs-executor");
  for (;;) {
    std::vector<uint64_t> group;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || stop_executor_; });
      if (queue_.empty()) return;
      group = std::move(queue_.front());
      queue_.pop_front();
    }
    run_group(std::move(group));
  }
}

void CollectiveBackend::run_group(std::vector<uint64_t> tokens) {
  // The tokens and views live once, shared by every copy of `finish`: the backend may call it later, from its own
  // thread (NCCL).
  struct Group {
    std::vector<uint64_t> tokens;
    std::vector<PartitionView> views;
  };
  auto g = std::make_shared<Group>();
  g->tokens = std::move(tokens);
  g->views.reserve(g->tokens.size());
  Status broken;
  {
    std::lock_guard lock(mu_);
    broken = fatal_;
    for (uint64_t t : g->tokens) g->views.push_back(items_.at(t).view);
  }
  // Once a rank is gone no collective can finish; fail queued work rather than wait for a transport timeout.
  auto finish = [this, g](const Status& st) {
    negotiator_->ran(g->views);
    negotiator_->completed();
    for (uint64_t t : g->tokens) complete(t, st);
  };
  if (!broken.ok()) {
    finish(broken);
    return;
  }
  const std::vector<PartitionView>& views = g->views;
  try {
    execute(views, finish);
  } catch (const std::exception& e) {
    const TaskDesc& t = *views.front().task;
    std::ostringstream os;
    os << name() << " rank " << rank_ << ": " << op_name(t.op) << " of task '" << t.name << "' (" << views.size()
       << " partition(s), first " << views.front().bytes << " bytes of " << dtype_name(t.dtype) << ") failed: " << e.what();
    if (negotiator_) negotiator_->judge_peers();  // a peer the transport saw fail first is judged lost now (fatal())
    Status st;
    {
      std::lock_guard lock(mu_);
      st = fatal_;  // a lost peer explains the failure better than the transport's error
    }
    if (st.ok() && negotiator_) st = ordered_failure(views);  // rank 0 ordered it, then a rank shut down
    if (st.ok()) st = Status::Error(os.str());
    else st.message += " (" + os.str() + ")";
    finish(st);
  }
}

Status CollectiveBackend::ordered_failure(const std::vector<PartitionView>& views) {
  for (const PartitionView& v : views)
    if (std::string why = negotiator_->ordered_failure(v.task->key, v.offset, v.task->round); !why.empty())
      return Status::Error(std::move(why), Status::Code::cancelled);
  return Status::Ok();
}

void CollectiveBackend::shutdown() {
  std::call_once(shutdown_once_, [this] {
    {
      std::lock_guard lock(mu_);
      accepting_ = false;
    }
    // Goodbye barrier first: work every rank already ordered still runs (peers run it too); the rest is cancelled.
    if (negotiator_) negotiator_->shutdown();
    {
      std::lock_guard lock(mu_);
      stop_executor_ = true;
    }
    cv_.notify_one();
    if (executor_.joinable()) executor_.join();
    drain();
  });
}

void CollectiveBackend::stop_base() { shutdown(); }

BackendCapabilities CollectiveBackend::capabilities() const {
  BackendCapabilities c = CommBackend::capabilities();
  c.global_order = negotiator_ ? &negotiator_->order_inbox() : nullptr;
  c.joins = c.carries.has(Op::allreduce, Device::cpu) ? negotiator_.get() : nullptr;
  c.stragglers = negotiator_.get();
  c.wait_helper = negotiator_.get();
  return c;
}

NegotiatorStats CollectiveBackend::negotiation_stats() const {
  return negotiator_ ? negotiator_->stats() : NegotiatorStats{};
}

}  // namespace commsched::collective
