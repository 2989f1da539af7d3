// Compression in the simulator: a NetworkModel decorator. Each batch waits for the encode stage (one encoder, busy
// for encode_s_per_mib per MiB of gradient), crosses the wrapped network as its compressed bytes (the very byte
// counts of compression/codec.h, for f32 gradients) and is done after the decode stage's time. Stage costs per MiB
// come from bench/micro/stage_micro_bench (see bench/RESULTS.md); the policy still sees, and credits, the gradient's
// own bytes, as in the engine.
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

class CompressedNetwork final : public NetworkModel {
 public:
  CompressedNetwork(std::unique_ptr<NetworkModel> inner, CompressionModel model);
  Transfer transfer(const Batch& batch, Nanos start) override;
  void reset() override;
  double comm_lower_bound_s(uint64_t bytes) const override;
  CostModel cost_model() const override;
  std::string describe() const override;

 private:
  uint64_t wire_bytes(uint64_t gradient_bytes) const;

  std::unique_ptr<NetworkModel> inner_;
  CompressionModel m_;
  Nanos encoder_free_ = 0;
};

// `net` itself when m.spec.scheme is none, else `net` wrapped in a CompressedNetwork.
std::unique_ptr<NetworkModel> with_compression(std::unique_ptr<NetworkModel> net, const CompressionModel& m);

}  // namespace commsched::sim
