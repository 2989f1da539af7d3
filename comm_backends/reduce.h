// The one set of summation kernels every backend calls: the parameter server's sums, Gloo's reduction callbacks, the
// loopback backend. f16 and bf16 accumulate in f32 and round to nearest even on store (NaN stays NaN), with the
// conversions of base/half.h; the loops are vectorised (AVX2/F16C when the CPU has them, chosen at run time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/half.h"
#include "base/types.h"

namespace commsched {

// Bytes per element of the accumulator of `t` (f32 for f16/bf16, the type itself otherwise).
size_t accumulator_size(DType t);
// True when the accumulator has a different type than the data (f16, bf16): a final narrow() is needed.
bool needs_narrowing(DType t);

namespace kernels {
// Accumulator kernels: a sum of W inputs has one rounding error for the half types, not W.
// acc = widen(a)
void widen(DType t, void* acc, const void* a, size_t n);
// acc = widen(a) + widen(b)
void add2(DType t, void* acc, const void* a, const void* b, size_t n);
// acc += widen(b)
void add(DType t, void* acc, const void* b, size_t n);
// out = narrow(acc) (round to nearest even); a copy when the types agree and out != acc
void narrow(DType t, void* out, const void* acc, size_t n);
// out = ((s[0] + s[1]) + s[2]) + ...: a fixed order, so the result is bitwise reproducible; out may not alias s.
void sum_ranked(DType t, void* out, std::span<const void* const> srcs, size_t n);
// out = a + b in the data type, element-wise; out may alias a or b. The pairwise step of a ring or tree all-reduce.
void sum_pair(DType t, void* out, const void* a, const void* b, size_t n);

using commsched::bf16_to_f32;
using commsched::f16_to_f32;
using commsched::f32_to_bf16;
using commsched::f32_to_f16;
}  // namespace kernels

// dst[i] += src[i] for `count` elements of `dtype` (kernels::sum_pair in place).
void sum_into(DType dtype, void* dst, const void* src, size_t count);

}  // namespace commsched
