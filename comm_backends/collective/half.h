// The bfloat16 sum Gloo lacks, on the shared conversions of comm_backends/half.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm_backends/half.h"

namespace commsched::collective {

// c[i] = a[i] + b[i] for bfloat16, computed in float (the signature Gloo's reduction callbacks use).
inline void sum_bf16(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

}  // namespace commsched::collective
