// Synthetic profiles for the simulator tests.
#pragma once

#include "workload/profile.h"

namespace commsched::sim::testing {

constexpr Nanos kMs = 1'000'000;

// One tensor of `bytes` (f32) with the given compute.
inline ModelProfile one_tensor(uint64_t bytes, Nanos fwd, Nanos bwd) {
  return make_profile("one", {{"w", 0, DType::f32, bytes / 4, fwd, bwd}});
}

// VGG-like: small, compute-heavy convolutions first, then huge, cheap fully connected layers (most of the bytes).
inline ModelProfile vgg_like() {
  std::vector<TensorProfile> t;
  int layer = 0;
  for (int i = 0; i < 8; ++i, ++layer) {
    t.push_back({"conv" + std::to_string(i) + ".w", layer, DType::f32, 600'000, 3 * kMs, 6 * kMs});
    t.push_back({"conv" + std::to_string(i) + ".b", layer, DType::f32, 256, 0, 0});
  }
  const uint64_t fc[] = {100'000'000, 16'000'000, 4'000'000};
  for (uint64_t n : fc) {
    t.push_back({"fc" + std::to_string(layer) + ".w", layer, DType::f32, n, kMs / 2, kMs});
    t.push_back({"fc" + std::to_string(layer) + ".b", layer, DType::f32, 4096, 0, 0});
    ++layer;
  }
  return make_profile("vgg-like", std::move(t));
}

}  // namespace commsched::sim::testing
