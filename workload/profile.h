// A model profile (workload/profiles/README.md): gradient tensors in forward order with per-module compute times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/types.h"

namespace commsched::sim {

struct TensorProfile {
  std::string name;
  int32_t layer = 0;       // owning module's index in forward order
  DType dtype = DType::f32;
  uint64_t elements = 0;
  Nanos forward = 0;       // the module's compute, carried by its first tensor (0 for the others)
  Nanos backward = 0;

  uint64_t bytes() const { return elements * dtype_size(dtype); }
};

// Tensors grouped by owning module, in forward order: what the simulated compute runs layer by layer.
struct LayerProfile {
  Nanos forward = 0;
  Nanos backward = 0;
  std::vector<size_t> tensors;  // indices into ModelProfile::tensors; a tensor's index is its priority
};

struct ModelProfile {
  std::string name;
  std::string source;
  int batch_size = 0;
  std::vector<TensorProfile> tensors;  // forward order
  std::vector<LayerProfile> layers;    // derived from tensors by finalize()

  uint64_t total_bytes() const;
  Nanos compute_per_iteration() const;  // forward + backward of every layer
  // Groups tensors into layers; throws InvalidArgument naming the tensor when layers are not in forward order.
  void finalize();
};

// The one resolution of a profile argument (`commsched run --model`, `commsched bench --models`): an existing file
// passes through; a name ("vgg16") is looked up as NAME.json in `first_dirs` (a caller's own folder), then in the
// source tree's workload/profiles, then in the installed share directory. Throws InvalidArgument naming the argument,
// every folder searched and the names found there.
std::string resolve_profile_path(const std::string& name_or_path, const std::vector<std::string>& first_dirs = {});
// Reads a profile file; throws InvalidArgument naming the file and the offending entry.
ModelProfile load_profile(const std::string& path);
// Parses profile JSON text (origin names it in errors).
ModelProfile parse_profile(const std::string& json_text, const std::string& origin);
// A profile from explicit tensors (tests, synthetic models).
ModelProfile make_profile(std::string name, std::vector<TensorProfile> tensors);

}  // namespace commsched::sim
