#include "comm_backends/gloo/gloo_backend.h"

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <arpa/inet.h>

#include <stdexcept>

#include "comm_backends/control/socket.h"
#include "comm_backends/reduce.h"

namespace commsched {
namespace {

std::chrono::milliseconds to_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

// Gloo's rendezvous Store over the commsched rendezvous store, under a key prefix.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(control::Store& kv, std::string prefix, std::chrono::milliseconds timeout)
      : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    kv_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = kv_.get(prefix_ + key, timeout_);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> scoped;
    for (const auto& k : keys) scoped.push_back(prefix_ + k);
    kv_.wait(scoped, std::chrono::steady_clock::now() + timeout);
  }

 private:
  control::Store& kv_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

bool is_ipv4_address(const std::string& s) {
  in_addr a;
  return ::inet_pton(AF_INET, s.c_str(), &a) == 1;
}

// COMMSCHED_BIND may name an address or an interface; Gloo takes either.
gloo::transport::tcp::attr transport_attr(const ClusterEnv& env) {
  gloo::transport::tcp::attr attr;
  if (!env.bind.empty() && !is_ipv4_address(env.bind)) attr.iface = env.bind;
  else attr.hostname = control::advertised_host(env);
  return attr;
}

// Gloo calls its reduction with c = a + b (c may alias a); every dtype uses the shared kernels, so the rounding of
// f16/bf16 sums is the same as the parameter server's and the loopback backend's.
template <DType D>
void sum_pair(void* c, const void* a, const void* b, size_t n) {
  kernels::sum_pair(D, c, a, b, n);
}

template <typename T>
void run_allreduce(const std::shared_ptr<gloo::Context>& ctx, void* data, size_t elements, uint32_t tag,
                   gloo::AllreduceOptions::Func reduce) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(static_cast<T*>(data), elements);
  opts.setReduceFunction(std::move(reduce));
  opts.setTag(tag);
  gloo::allreduce(opts);
}

}  // namespace

void gloo_allreduce_sum(const std::shared_ptr<gloo::Context>& ctx, void* data, DType dtype, size_t elements, uint32_t tag) {
  switch (dtype) {
    case DType::f32: return run_allreduce<float>(ctx, data, elements, tag, &sum_pair<DType::f32>);
    case DType::f64: return run_allreduce<double>(ctx, data, elements, tag, &sum_pair<DType::f64>);
    case DType::i32: return run_allreduce<int32_t>(ctx, data, elements, tag, &sum_pair<DType::i32>);
    case DType::i64: return run_allreduce<int64_t>(ctx, data, elements, tag, &sum_pair<DType::i64>);
    case DType::f16: return run_allreduce<uint16_t>(ctx, data, elements, tag, &sum_pair<DType::f16>);
    case DType::bf16: return run_allreduce<uint16_t>(ctx, data, elements, tag, &sum_pair<DType::bf16>);
  }
  throw std::invalid_argument("gloo allreduce: unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

GlooMesh connect_gloo_mesh(const ClusterEnv& env, int rank, int size, control::Store& kv, const std::string& prefix) {
  GlooMesh mesh;
  control::ignore_sigpipe_unless_handled();  // a killed peer must fail our writes, not kill this rank (CI saw it)
  mesh.device = gloo::transport::tcp::CreateDevice(transport_attr(env));
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  // Connecting waits (with the context's timeout) for ranks that may still be starting, as long as the rest of the
  // rendezvous does: with COMMSCHED_TIMEOUT a rank that reached init() seconds after the others failed the job.
  const auto join = to_ms(join_timeout_s(env.timeout_s));
  ctx->setTimeout(join);
  GlooStore store(kv, prefix, join);
  try {
    ctx->connectFullMesh(store, mesh.device);
  } catch (const std::exception& e) {
    throw std::runtime_error("gloo rank " + std::to_string(rank) + " of " + std::to_string(size) +
                             ": connecting to every rank failed: " + e.what());
  }
  // From here Gloo's timeout bounds every collective, so a hung (not dead) peer is noticed too.
  ctx->setTimeout(to_ms(env.timeout_s));
  mesh.context = ctx;
  return mesh;
}

GlooBackend::GlooBackend(const ClusterEnv& env, collective::CollectiveOptions opts)
    : CollectiveBackend(env.rank, env.num_workers), env_(env), rendezvous_(env, "commsched/gloo/") {
  env.validate();
  GlooMesh mesh = connect_gloo_mesh(env, env.rank, env.num_workers, rendezvous_.store(), rendezvous_.scope() + "mesh/");
  device_ = std::move(mesh.device);
  context_ = std::move(mesh.context);
  auto nopts = opts.negotiator_options(env);
  nopts.key_prefix = rendezvous_.scope() + "negotiator/";
  // Gloo collectives are synchronous: they run on the negotiator thread that receives (on rank 0: makes) the order.
  start_negotiation(nopts, rendezvous_.store(), /*execute_on_negotiator_thread=*/true);
}

GlooBackend::~GlooBackend() { stop_base(); }

void GlooBackend::allreduce(void* data, DType dtype, size_t elements) {
  gloo_allreduce_sum(context_, data, dtype, elements, tag_++);
}

void GlooBackend::broadcast(void* data, size_t bytes, int root) {
  gloo::BroadcastOptions opts(context_);
  opts.setOutput(static_cast<uint8_t*>(data), bytes);
  opts.setRoot(root);
  opts.setTag(tag_++);
  gloo::broadcast(opts);
}

void GlooBackend::execute(std::span<const PartitionView> group, GroupDone done) {
  if (size() == 1) {  // nothing to exchange: the sum of one rank is itself, and so is a broadcast
    done(Status::Ok());
    return;
  }
  try {
    if (group.size() > 1) {
      execute_fused(group);
    } else {
      const PartitionView& p = group.front();
      if (p.task->op == Op::broadcast) broadcast(p.data(), p.bytes, p.task->root);
      else allreduce(p.data(), p.task->dtype, p.elements());
    }
  } catch (...) {
    // A failed collective leaves the mesh unusable. Closing it ends the collective at once on the ranks that wait
    // on this one (in a ring, a rank waits on its neighbour, not on the rank that died), so every rank learns of the
    // loss within moments instead of after Gloo's timeout.
    context_->closeConnections();
    throw;
  }
  done(Status::Ok());
}

void GlooBackend::execute_fused(std::span<const PartitionView> group) {
  const TaskDesc& first = *group.front().task;
  fusion_.run(group, [&](void* data, size_t bytes) {
    if (first.op == Op::broadcast) broadcast(data, bytes, first.root);
    else allreduce(data, first.dtype, bytes / dtype_size(first.dtype));
  });
}

}  // namespace commsched
