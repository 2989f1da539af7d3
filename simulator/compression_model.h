// Compression in the simulator: what a compression scheme adds to a batch, shared by every network model.
// - The encode stage: one encoder per worker, busy encode_s_per_mib per MiB of gradient, before the batch's pushes.
// - The wire: the compressed bytes (the very byte counts of compression/codec.h, for f32 gradients).
// - The decode stage: decode_s_per_mib per MiB after the results are back.
// - On a parameter server, for the schemes whose sum is not defined on the wire (top-k, signSGD), the server decodes
//   every push and encodes the sum again (comm_backends/ps/slot_table.cc: decode_add, encode_sum): the same codec
//   code as the workers run, so the same per-MiB costs (a decode per push, an encode per sum).
// Stage costs per MiB come from bench/micro/stage_micro_bench (see bench/RESULTS.md); the policy still sees, and
// credits, the gradient's own bytes, as in the engine.
//
// CompressedNetwork decorates a NetworkModel with this; PsClusterFabric (ps_cluster.h) applies it per worker and per
// server with the functions below.
#pragma once

#include <memory>

#include "simulator/network.h"
#include "compression/codec.h"

namespace commsched::sim {

struct CompressionModel {
  compression::Spec spec;          // scheme none: no decorator
  double encode_s_per_mib = 0;     // CPU time of the encode stage per MiB of f32 gradient
  double decode_s_per_mib = 0;
};

// The scheme with the stage costs stage_micro_bench measured (bench/RESULTS.md, "Compression stage cost per MiB");
// none: no costs.
CompressionModel measured_compression(const compression::Spec& spec);

bool compressed(const CompressionModel& m);
// Bytes on the wire for `gradient_bytes` of f32 gradient (0 stays 0).
uint64_t wire_bytes(const CompressionModel& m, uint64_t gradient_bytes);
Nanos encode_ns(const CompressionModel& m, uint64_t gradient_bytes);
Nanos decode_ns(const CompressionModel& m, uint64_t gradient_bytes);
// Whether a parameter server decodes each push and encodes the sum (top-k, signSGD); fp16/bf16 sum as they are.
// Such a push is also never cut into chunks (comm_backends/ps/ps_backend.cc sends a compressed partition whole).
bool server_recodes(const CompressionModel& m);

class CompressedNetwork final : public NetworkModel {
 public:
  // ps_workers > 0: `inner` is a parameter server with that many workers; where the server recodes, a batch's results
  // also wait for ps_workers decodes and one encode on its server.
  CompressedNetwork(std::unique_ptr<NetworkModel> inner, CompressionModel model, int ps_workers = 0);
  Transfer transfer(const Batch& batch, Nanos start) override;
  void reset() override;
  double comm_lower_bound_s(uint64_t bytes, uint64_t messages) const override;
  CostModel cost_model() const override;
  std::string describe() const override;

 private:
  std::unique_ptr<NetworkModel> inner_;
  CompressionModel m_;
  int ps_workers_;
  Nanos encoder_free_ = 0;
};

// `net` itself when m.spec.scheme is none, else `net` wrapped in a CompressedNetwork (ps_workers as there).
std::unique_ptr<NetworkModel> with_compression(std::unique_ptr<NetworkModel> net, const CompressionModel& m,
                                               int ps_workers = 0);

}  // namespace commsched::sim
