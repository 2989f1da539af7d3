// The local collective of hierarchical mode on Gloo: the workers of one machine as one Gloo mesh (TCP on loopback),
// every commsched dtype summed with the shared kernels. The CPU mode of hierarchical mode, and its stand-in for NCCL.
#pragma once

#include <memory>

#include "comm_backends/gloo/gloo_backend.h"
#include "comm_backends/hierarchical/local_collective.h"

namespace commsched {

class GlooLocalCollective final : public LocalCollective {
 public:
  GlooLocalCollective(GlooMesh mesh, int local_rank, int local_size);
  std::string_view name() const override { return "gloo"; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return size_; }
  // One reduce per slice to the slice's own rank: the same bytes on the wire as a ring reduce-scatter, and Gloo's
  // reduce takes any element type and any (also empty) slice.
  void reduce_scatter(std::byte* data, DType dtype, std::span<const uint64_t> slices) override;
  void all_gather(std::byte* data, DType dtype, std::span<const uint64_t> slices) override;

 private:
  void reduce_to(std::byte* data, DType dtype, uint64_t n, int root);

  GlooMesh mesh_;
  int rank_, size_;
  uint32_t tag_ = 0;
  std::vector<std::byte> mine_;  // all_gather's input: this rank's slice, apart from the output it is gathered into
};

}  // namespace commsched
