// Element-wise sums over every dtype, for backends that reduce on the CPU (loopback, and anyone who wants a simple,
// portable reference). f16 and bf16 are accumulated in f32 and rounded to nearest-even on store.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm_backends/half.h"
#include "scheduler/types.h"

namespace commsched {

// dst[i] += src[i] for `count` elements of `dtype`.
void sum_into(DType dtype, void* dst, const void* src, size_t count);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);

}  // namespace commsched
