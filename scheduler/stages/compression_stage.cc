#include "scheduler/stages/compression_stage.h"

#include "comm_backends/comm_backend.h"

namespace commsched {
namespace {

using compression::Scheme;

size_t esize(DType d) { return d == DType::f64 ? 8 : (d == DType::f32 ? 4 : 2); }  // floating dtypes only

// The partition's wire buffer and the TaskDesc that describes it to the backend (a cast changes the dtype).
struct Wire final : StageState {
  TaskDesc desc;
  std::unique_ptr<std::byte[]> bytes;
};

}  // namespace

std::string CompressionStage::refusal(const TaskDesc& task, const CommBackend& backend) const {
  const Scheme s = task.compression.scheme;
  // On one rank nothing is summed: the result is this rank's own message, decoded.
  if (compression::sums_on_wire(s) || backend.size() == 1) return {};
  const std::string what = "compression '" + std::string(compression::scheme_name(s)) + "' ";
  if (task.op == Op::allreduce)
    return what + "cannot be used with allreduce on backend '" + std::string(backend.name()) +
           "': an all-reduce sums the bytes it is given, and only fp16 and bf16 sum on the wire";
  if (!backend.capabilities().reduces(s))
    return what + "needs a reduction that decodes it, and backend '" + std::string(backend.name()) + "' (" +
           std::to_string(backend.size()) + " ranks) has none";
  return {};
}

std::byte* CompressionStage::residual_for(const TaskDesc& t) {
  std::lock_guard lk(mu_);
  Residual& r = residuals_[t.name];
  if (r.count != t.count || r.dtype != t.dtype) {  // a new tensor under this name: start from zero
    r.dtype = t.dtype;
    r.count = t.count;
    r.data.assign(t.count * esize(compression::residual_dtype(t.dtype)), std::byte{0});
  }
  return r.data.data();
}

std::vector<std::byte> CompressionStage::residual(const std::string& name) const {
  std::lock_guard lk(mu_);
  auto it = residuals_.find(name);
  return it == residuals_.end() ? std::vector<std::byte>{} : it->second.data;
}

void CompressionStage::encode(const PartitionView& in, PartitionView& out, std::unique_ptr<StageState>& state) {
  const TaskDesc& t = *in.task;
  const compression::Spec& spec = t.compression;
  const uint64_t n = in.elements();
  auto w = std::make_unique<Wire>();
  w->desc = t;
  const uint64_t wire_bytes = compression::encoded_bytes(spec, t.dtype, n);
  w->bytes = std::make_unique_for_overwrite<std::byte[]>(std::max<uint64_t>(wire_bytes, 1));
  void* residual = nullptr;
  if (!compression::sums_on_wire(spec.scheme))
    residual = residual_for(t) + in.first_element() * esize(compression::residual_dtype(t.dtype));
  compression::encode(spec, t.dtype, in.data(), n, residual, w->bytes.get());
  out = in;
  out.task = &w->desc;
  out.payload = w->bytes.get();
  out.bytes = wire_bytes;
  if (!compression::sums_on_wire(spec.scheme)) out.dense_bytes = in.bytes;
  if (compression::sums_on_wire(spec.scheme)) {
    // A cast is a tensor of the narrow dtype: offsets and sizes in its units, so every backend carries it as such.
    w->desc.dtype = compression::codec(spec.scheme).wire_dtype;
    out.offset = in.first_element() * dtype_size(w->desc.dtype);
  }
  state = std::move(w);
}

void CompressionStage::decode(const PartitionView& wire, const PartitionView& target, std::unique_ptr<StageState>&) {
  const TaskDesc& t = *target.task;
  compression::decode(t.compression, t.dtype, wire.data(), target.elements(), target.data());
}

}  // namespace commsched
