// GlooBackend: allreduce (sum) and broadcast of CPU tensors over Gloo's TCP transport, every commsched dtype
// (f32, f64, i32, i64, f16, bf16), summed with the shared kernels of comm_backends/reduce.h. Ranks meet through the
// ClusterEnv rendezvous (a store served by rank 0 at COMMSCHED_ROOT_ADDR:COMMSCHED_ROOT_PORT), and the order
// negotiation makes every rank run the same collectives in the same order.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/collective/fusion_buffer.h"
#include "comm_backends/collective/kv_store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace commsched {

class GlooBackend : public collective::CollectiveBackend {
 public:
  // Connects to every rank (blocks until all have joined or the join timeout passes); throws naming the problem.
  explicit GlooBackend(const ClusterEnv& env, collective::CollectiveOptions opts = collective::CollectiveOptions::from_env());
  ~GlooBackend() override;

  std::string_view name() const override { return "gloo"; }

  // The connected Gloo context, for baselines that call Gloo directly (benchmarks); do not use while work is running.
  const std::shared_ptr<gloo::Context>& context() const { return context_; }

 protected:
  void execute(std::span<const PartitionView> group, GroupDone done) override;

 private:
  void allreduce(void* data, DType dtype, size_t elements);
  void broadcast(void* data, size_t bytes, int root);
  // Runs a fused group as one collective through the shared fusion buffer.
  void execute_fused(std::span<const PartitionView> group);

  ClusterEnv env_;
  collective::Rendezvous rendezvous_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  collective::FusionBuffer fusion_{collective::host_fusion_memory()};
  uint32_t tag_ = 0;
};

// A connected Gloo mesh: the context, and the TCP device its pairs live on.
struct GlooMesh {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::Context> context;
};
// Connects `rank` of `size` processes into a full mesh whose addresses meet in `store` under `prefix`; the bind
// address (COMMSCHED_BIND) and the timeouts come from `env`. Throws naming the rank when it fails.
GlooMesh connect_gloo_mesh(const ClusterEnv& env, int rank, int size, control::Store& store, const std::string& prefix);

// Sums `elements` values of `dtype` in place across every rank of a connected Gloo context. Exposed for the benchmark's
// plain-Gloo baseline so both sides use the same reduction.
void gloo_allreduce_sum(const std::shared_ptr<gloo::Context>& ctx, void* data, DType dtype, size_t elements, uint32_t tag);

}  // namespace commsched
