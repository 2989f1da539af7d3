#include "comm_backends/hierarchical/hierarchical_backend.h"
#include "comm_backends/backend_registry.h"

#include <chrono>
#include <iostream>
#include <stdexcept>

#include "scheduler/completion_waiter.h"

namespace commsched {
namespace {

// Checked before any member connects anything.
const ClusterEnv& checked(const ClusterEnv& env) {
  env.validate();
  const std::string where = "COMMSCHED_HIERARCHICAL: ";
  if (env.local_size < 2)
    throw InvalidArgument(where + "COMMSCHED_LOCAL_SIZE=" + std::to_string(env.local_size) +
                          ": one worker per machine has no hierarchy (the plain parameter server path serves it)");
  if (env.num_workers % env.local_size != 0)
    throw InvalidArgument(where + "COMMSCHED_NUM_WORKERS=" + std::to_string(env.num_workers) +
                          " is not a multiple of COMMSCHED_LOCAL_SIZE=" + std::to_string(env.local_size) +
                          ": every machine needs the same number of workers");
  if (env.rank % env.local_size != env.local_rank)
    throw InvalidArgument(where + "worker " + std::to_string(env.rank) + " has COMMSCHED_LOCAL_RANK=" +
                          std::to_string(env.local_rank) + ", expected " + std::to_string(env.rank % env.local_size) +
                          ": the workers of a machine must have consecutive ranks (as `commsched launch` numbers them)");
  return env;
}

ClusterEnv coordination_env(const ClusterEnv& env, const HierarchicalOptions& o) {
  ClusterEnv c = env;
  c.root_port = o.port != 0 ? o.port : env.root_port + 1;
  if (c.root_port > 65535)
    throw InvalidArgument("COMMSCHED_HIERARCHICAL_PORT: COMMSCHED_ROOT_PORT + 1 is not a port; set one");
  return c;
}

// A fused group's bytes are one range of their own on the PS: a key of the group (its first partition and its size),
// so it never meets the slots of the partitions it was made of.
TaskDesc fused_wire(std::span<const PartitionView> group, uint64_t bytes) {
  const TaskDesc& first = *group.front().task;
  TaskDesc d = first;
  d.name = "fused group of " + std::to_string(group.size()) + " partitions from '" + first.name + "'";
  d.key = task_key(d.name + "@" + std::to_string(group.front().offset));
  d.count = bytes / dtype_size(first.dtype);
  d.buffer.data = nullptr;  // the fusion buffer, on the device the group's tensors are on
  d.op = Op::push_pull;
  return d;
}

}  // namespace

const OptionTable<HierarchicalOptions>& HierarchicalOptions::table() {
  static const OptionTable<HierarchicalOptions> t = [] {
    using H = HierarchicalOptions;
    OptionTable<H> t("hierarchical", "hierarchical");
    t.bind("hierarchical", "COMMSCHED_HIERARCHICAL", [](H& h) -> std::string& { return h.local; },
           choice_value({"off", "gloo", "nccl"}),
           "parameter server: reduce-scatter among the workers of each machine with this local collective (gloo: host "
           "memory; nccl: one GPU each), push and pull one slice per worker, all-gather (BytePS's hierarchical mode); "
           "one worker per machine: plain PS");
    t.bind("hierarchical_port", "COMMSCHED_HIERARCHICAL_PORT", [](H& h) -> int& { return h.port; },
           int_value(0, 65535), "hierarchical mode's rendezvous port on rank 0 (0: COMMSCHED_ROOT_PORT + 1)");
    return t;
  }();
  return t;
}

HierarchicalOptions HierarchicalOptions::from_env() {
  HierarchicalOptions o;
  table().set_from_env(o);
  return o;
}

std::vector<uint64_t> lane_slices(uint64_t elements, int local_size) {
  if (local_size < 1) throw std::invalid_argument("lane_slices: local_size must be at least 1");
  const auto n = static_cast<uint64_t>(local_size);
  std::vector<uint64_t> out(n, elements / n);
  for (uint64_t r = 0; r < elements % n; ++r) ++out[r];
  return out;
}

HierarchicalBackend::HierarchicalBackend(const ClusterEnv& env, const PsConfig& ps, const HierarchicalOptions& options,
                                         collective::CollectiveOptions collective,
                                         const LocalCollectiveFactory& make_local,
                                         std::shared_ptr<DeviceCopier> copier)
    : CollectiveBackend(checked(env).rank, env.num_workers),
      env_(env),
      coordination_(coordination_env(env, options)),
      machines_(env.num_workers / env.local_size),
      rendezvous_(coordination_, "commsched/hierarchical/"),
      copier_(std::move(copier)) {
  if (!make_local) throw InvalidArgument("COMMSCHED_HIERARCHICAL: no local collective given");
  const int machine = env.rank / env.local_size;
  local_ = make_local(coordination_, env.local_rank, env.local_size, rendezvous_.store(),
                      rendezvous_.scope() + "machine" + std::to_string(machine) + "/");
  fusion_ = std::make_unique<collective::FusionBuffer>(local_->fusion_memory());
  if (local_->memory() != Device::cpu) {
    if (!copier_) throw InvalidArgument("COMMSCHED_HIERARCHICAL=" + options.local + ": no device copier to stage slices");
    staging_ = StagingPool::make(copier_);
  }
  ps_ = std::make_unique<PsBackend>(env, ps);
  ps_->set_lane_contributors(static_cast<uint32_t>(machines_));
  auto nopts = collective.negotiator_options(coordination_);
  nopts.key_prefix = rendezvous_.scope() + "negotiator/";
  // Synchronous, as Gloo's: the group runs on the negotiator thread that receives (on rank 0: makes) the order.
  start_negotiation(nopts, rendezvous_.store(), /*execute_on_negotiator_thread=*/true);
  if (env.rank == 0)  // which path a run takes is not visible anywhere else
    std::cerr << "[commsched] hierarchical mode: " << machines_ << " machine(s) x " << env.local_size
              << " workers, local collective " << local_->name() << ", one slice per worker through the PS\n";
}

HierarchicalBackend::~HierarchicalBackend() { shutdown(); }

void HierarchicalBackend::shutdown() {
  std::call_once(shutdown_once_, [this] {
    CollectiveBackend::shutdown();  // ordered work finishes on every worker first
    if (ps_) ps_->shutdown();       // then the goodbyes to the servers
  });
}

BackendCapabilities HierarchicalBackend::capabilities() const {
  BackendCapabilities c = CollectiveBackend::capabilities();
  if (const BackendInfo* ps = find_backend("ps"))
    for (Op op : ps->ops)
      if (ps->carries(op, Device::cpu)) c.carries.add(op, local_->memory());
  c.cuda_device = local_->device_index();
  return c;
}

Status HierarchicalBackend::through_ps_staged(const std::vector<PartitionView>& batch) {
  const int device = local_->device_index();
  std::vector<TaskDesc> host(batch.size());  // the PS sees host buffers: its own descriptions, stable while it runs
  std::vector<StagingBuffer> buffers;
  std::vector<PartitionView> staged;
  for (size_t i = 0; i < batch.size(); ++i) {
    const PartitionView& v = batch[i];
    host[i] = *v.task;
    host[i].buffer = Buffer{};
    buffers.push_back(staging_->acquire(v.bytes));
    copier_->to_host(buffers.back().data(), v.data(), v.bytes, device, nullptr)->wait();
    PartitionView h = v;
    h.task = &host[i];
    h.payload = buffers.back().data();
    staged.push_back(h);
  }
  const Status st = through_ps(staged);
  if (!st.ok()) return st;
  for (size_t i = 0; i < batch.size(); ++i)
    copier_->to_device(batch[i].data(), buffers[i].data(), batch[i].bytes, device)->wait();
  return st;
}

Status HierarchicalBackend::through_ps(std::vector<PartitionView> batch) {
  if (staging_ && batch.front().task->buffer.device != Device::cpu) return through_ps_staged(batch);
  CompletionWaiter waiter;
  ps_->start(std::move(batch), waiter.callback());
  // No limit of its own: every worker reaches this slice next (the negotiated order), and the PS fails the request
  // when a peer is lost.
  return waiter.wait(std::chrono::hours(24 * 365));
}

void HierarchicalBackend::reduce(std::byte* data, const TaskDesc& wire, uint64_t offset, uint64_t bytes) {
  const uint64_t es = dtype_size(wire.dtype);
  const std::vector<uint64_t> slices = lane_slices(bytes / es, env_.local_size);
  local_->reduce_scatter(data, wire.dtype, slices);
  uint64_t at = 0;
  for (int r = 0; r < env_.local_rank; ++r) at += slices[static_cast<size_t>(r)] * es;
  const uint64_t mine = slices[static_cast<size_t>(env_.local_rank)] * es;
  if (mine > 0) {  // a range shorter than the machine leaves some lanes empty, alike on every machine
    const Status st = through_ps({PartitionView{&wire, 0, offset + at, mine, data + at}});
    if (!st.ok()) throw std::runtime_error("hierarchical: the parameter server failed slice [" + std::to_string(offset + at) +
                                           ", " + std::to_string(offset + at + mine) + ") of '" + wire.name + "': " +
                                           st.message);
  }
  local_->all_gather(data, wire.dtype, slices);
}

void HierarchicalBackend::execute(std::span<const PartitionView> group, GroupDone done) {
  const TaskDesc& first = *group.front().task;
  if (first.op == Op::broadcast) return done(through_ps(std::vector<PartitionView>(group.begin(), group.end())));
  if (group.size() == 1) {
    const PartitionView& p = group.front();
    TaskDesc wire = first;
    wire.op = Op::push_pull;  // the lane's sum, whichever reduction the engine asked for
    reduce(p.data(), wire, p.offset, p.bytes);
  } else {
    fusion_->run(group, [&](void* data, size_t bytes) {
      const TaskDesc wire = fused_wire(group, bytes);
      reduce(static_cast<std::byte*>(data), wire, 0, bytes);
    });
  }
  done(Status::Ok());
}

std::shared_ptr<CommBackend> make_parameter_server(const ClusterEnv& env, const PsConfig& ps,
                                                   const HierarchicalOptions& options,
                                                   const collective::CollectiveOptions& collective,
                                                   const LocalCollectiveFactory& make_local,
                                                   std::shared_ptr<DeviceCopier> copier) {
  if (!options.enabled() || env.local_size == 1) return std::make_shared<PsBackend>(env, ps);
  // Its lanes are one machine's slice of one synchronous round (ps/async_table.h refuses them).
  if (ps.mode != "sync")
    throw InvalidArgument("COMMSCHED_HIERARCHICAL=" + options.local + " needs COMMSCHED_PS_MODE=sync (it is " + ps.mode + ")");
  if (!make_local)
    throw InvalidArgument("COMMSCHED_HIERARCHICAL=" + options.local + ", but this build has no " + options.local +
                          (options.local == "nccl" ? " (install the CUDA toolkit and NCCL and rebuild)"
                                                   : " (install libgloo-dev and rebuild)"));
  return std::make_shared<HierarchicalBackend>(env, ps, options, collective, make_local, std::move(copier));
}

}  // namespace commsched
