#include "simulator/compression_model.h"

#include <algorithm>
#include <cmath>

namespace commsched::sim {
namespace {
Nanos stage_ns(double s_per_mib, uint64_t bytes) {
  return static_cast<Nanos>(std::llround(s_per_mib * static_cast<double>(bytes) / (1 << 20) * 1e9));
}
}  // namespace

CompressedNetwork::CompressedNetwork(std::unique_ptr<NetworkModel> inner, CompressionModel model)
    : inner_(std::move(inner)), m_(model) {}

uint64_t CompressedNetwork::wire_bytes(uint64_t gradient_bytes) const {
  return compression::encoded_bytes(m_.spec, DType::f32, gradient_bytes / 4);
}

Transfer CompressedNetwork::transfer(const Batch& batch, Nanos start) {
  Batch wire = batch;
  uint64_t bytes = 0;
  for (PartRef& p : wire) {
    bytes += p.bytes;
    p.bytes = wire_bytes(p.bytes);
  }
  const Nanos encoded = std::max(start, encoder_free_) + stage_ns(m_.encode_s_per_mib, bytes);
  encoder_free_ = encoded;
  Transfer t = inner_->transfer(wire, encoded);
  t.end += stage_ns(m_.decode_s_per_mib, bytes);
  return t;
}

void CompressedNetwork::reset() {
  inner_->reset();
  encoder_free_ = 0;
}

double CompressedNetwork::comm_lower_bound_s(uint64_t bytes) const { return inner_->comm_lower_bound_s(wire_bytes(bytes)); }

CostModel CompressedNetwork::cost_model() const {
  CostModel c = inner_->cost_model();
  const double ratio = static_cast<double>(wire_bytes(1 << 20)) / (1 << 20);
  c.beta_s_per_byte = c.beta_s_per_byte * ratio + (m_.encode_s_per_mib + m_.decode_s_per_mib) / (1 << 20);
  return c;
}

std::string CompressedNetwork::describe() const {
  return inner_->describe() + " with " + compression::to_string(m_.spec) + " compression";
}

std::unique_ptr<NetworkModel> with_compression(std::unique_ptr<NetworkModel> net, const CompressionModel& m) {
  if (m.spec.scheme == compression::Scheme::none) return net;
  return std::make_unique<CompressedNetwork>(std::move(net), m);
}

}  // namespace commsched::sim
