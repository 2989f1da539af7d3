#include "comm_backends/gloo/gloo_local_collective.h"

#include <gloo/allgatherv.h>
#include <gloo/reduce.h>

#include <cstring>
#include <stdexcept>

#include "comm_backends/reduce.h"

namespace commsched {

GlooLocalCollective::GlooLocalCollective(GlooMesh mesh, int local_rank, int local_size)
    : mesh_(std::move(mesh)), rank_(local_rank), size_(local_size) {
  if (!mesh_.context) throw std::invalid_argument("GlooLocalCollective: no Gloo context");
}

namespace {

// Gloo cuts a reduction into segments of whole elements of T, so T must have the dtype's width; the sum itself is the
// shared kernel of the real dtype (the same rounding as the parameter server's for f16/bf16).
template <typename T>
void reduce_as(const std::shared_ptr<gloo::Context>& ctx, std::byte* data, DType dtype, uint64_t n, int root,
               uint32_t tag) {
  gloo::ReduceOptions opts(ctx);
  opts.setInput(reinterpret_cast<T*>(data), n);
  opts.setOutput(reinterpret_cast<T*>(data), n);
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setReduceFunction([dtype](void* c, const void* a, const void* b, size_t elements) {
    kernels::sum_pair(dtype, c, a, b, elements);
  });
  gloo::reduce(opts);
}

}  // namespace

void GlooLocalCollective::reduce_to(std::byte* data, DType dtype, uint64_t n, int root) {
  const uint32_t tag = tag_++;
  switch (dtype_size(dtype)) {
    case 2: return reduce_as<uint16_t>(mesh_.context, data, dtype, n, root, tag);
    case 4: return reduce_as<uint32_t>(mesh_.context, data, dtype, n, root, tag);
    case 8: return reduce_as<uint64_t>(mesh_.context, data, dtype, n, root, tag);
  }
  throw std::invalid_argument("gloo reduce: no element type of " + std::to_string(dtype_size(dtype)) + " bytes");
}

void GlooLocalCollective::reduce_scatter(std::byte* data, DType dtype, std::span<const uint64_t> slices) {
  if (slices.size() != static_cast<size_t>(size_)) throw std::invalid_argument("reduce_scatter: one slice per local rank");
  const size_t es = dtype_size(dtype);
  std::byte* at = data;
  for (int r = 0; r < size_; ++r) {
    const uint64_t n = slices[static_cast<size_t>(r)];
    if (n > 0) reduce_to(at, dtype, n, r);  // every rank skips the same empty slices
    at += n * es;
  }
}

void GlooLocalCollective::all_gather(std::byte* data, DType dtype, std::span<const uint64_t> slices) {
  if (slices.size() != static_cast<size_t>(size_)) throw std::invalid_argument("all_gather: one slice per local rank");
  const size_t es = dtype_size(dtype);
  std::vector<size_t> bytes(slices.size());
  size_t mine_at = 0;
  for (size_t r = 0; r < slices.size(); ++r) {
    bytes[r] = slices[r] * es;
    if (static_cast<int>(r) < rank_) mine_at += bytes[r];
  }
  const size_t mine = bytes[static_cast<size_t>(rank_)];
  mine_.resize(std::max<size_t>(mine, 1));
  std::memcpy(mine_.data(), data + mine_at, mine);
  gloo::AllgathervOptions opts(mesh_.context);
  opts.setInput(reinterpret_cast<uint8_t*>(mine_.data()), mine);
  opts.setOutput(reinterpret_cast<uint8_t*>(data), bytes);
  opts.setTag(tag_++);
  gloo::allgatherv(opts);
}

}  // namespace commsched
