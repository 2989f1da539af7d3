#include "simulator/compression_model.h"

#include <algorithm>
#include <cmath>

namespace commsched::sim {
namespace {
Nanos stage_ns(double s_per_mib, uint64_t bytes) {
  return static_cast<Nanos>(std::llround(s_per_mib * static_cast<double>(bytes) / (1 << 20) * 1e9));
}
}  // namespace

CompressionModel measured_compression(const compression::Spec& spec) {
  const compression::Codec& c = compression::codec(spec.scheme);  // its row carries the measured stage costs
  return {spec, c.encode_s_per_mib, c.decode_s_per_mib};
}

bool compressed(const CompressionModel& m) { return m.spec.scheme != compression::Scheme::none; }

uint64_t wire_bytes(const CompressionModel& m, uint64_t gradient_bytes) {
  if (gradient_bytes == 0) return 0;
  return compression::encoded_bytes(m.spec, DType::f32, gradient_bytes / 4);
}

Nanos encode_ns(const CompressionModel& m, uint64_t gradient_bytes) { return stage_ns(m.encode_s_per_mib, gradient_bytes); }
Nanos decode_ns(const CompressionModel& m, uint64_t gradient_bytes) { return stage_ns(m.decode_s_per_mib, gradient_bytes); }

bool server_recodes(const CompressionModel& m) { return compressed(m) && !compression::sums_on_wire(m.spec.scheme); }

CompressedNetwork::CompressedNetwork(std::unique_ptr<NetworkModel> inner, CompressionModel model, int ps_workers)
    : inner_(std::move(inner)), m_(model), ps_workers_(ps_workers) {}

Transfer CompressedNetwork::transfer(const Batch& batch, Nanos start) {
  Batch wire = batch;
  uint64_t bytes = 0;
  for (PartRef& p : wire) {
    bytes += p.bytes;
    p.bytes = wire_bytes(m_, p.bytes);
  }
  const Nanos encoded = std::max(start, encoder_free_) + encode_ns(m_, bytes);
  encoder_free_ = encoded;
  Transfer t = inner_->transfer(wire, encoded);
  if (ps_workers_ > 0 && server_recodes(m_)) t.end += ps_workers_ * decode_ns(m_, bytes) + encode_ns(m_, bytes);
  t.end += decode_ns(m_, bytes);
  return t;
}

void CompressedNetwork::reset() {
  inner_->reset();
  encoder_free_ = 0;
}

// The messages counted are the base class's one per tensor: a compressed tensor's chunks are cut from its compressed
// partitions, which the tensor's size alone does not tell.
double CompressedNetwork::comm_lower_bound_s(uint64_t bytes, uint64_t messages) const {
  return inner_->comm_lower_bound_s(wire_bytes(m_, bytes), messages);
}

CostModel CompressedNetwork::cost_model() const {
  CostModel c = inner_->cost_model();
  const double ratio = static_cast<double>(wire_bytes(m_, 1 << 20)) / (1 << 20);
  c.beta_s_per_byte = c.beta_s_per_byte * ratio + (m_.encode_s_per_mib + m_.decode_s_per_mib) / (1 << 20);
  return c;
}

std::string CompressedNetwork::describe() const {
  return inner_->describe() + " with " + compression::to_string(m_.spec) + " compression";
}

std::unique_ptr<NetworkModel> with_compression(std::unique_ptr<NetworkModel> net, const CompressionModel& m,
                                               int ps_workers) {
  if (!compressed(m)) return net;
  return std::make_unique<CompressedNetwork>(std::move(net), m, ps_workers);
}

}  // namespace commsched::sim
