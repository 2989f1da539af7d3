// Element-wise summation kernels of the server. f16 and bf16 accumulate in f32 and round once at the end, so a sum of
// W pushes has one rounding error, not W. Kernels are vectorised (AVX2/F16C when the CPU has them, chosen at run time).
// A Summer spreads big ranges over oneTBB worker threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "comm_backends/half.h"
#include "scheduler/types.h"

namespace commsched::ps {

// Bytes per element of the accumulator of `t` (f32 for f16/bf16, the type itself otherwise).
size_t accumulator_size(DType t);
// True when the accumulator has a different type than the data (f16, bf16): a final narrow() is needed.
bool needs_narrowing(DType t);

namespace kernels {
// acc = widen(a)
void widen(DType t, void* acc, const void* a, size_t n);
// acc = widen(a) + widen(b)
void add2(DType t, void* acc, const void* a, const void* b, size_t n);
// acc += widen(b)
void add(DType t, void* acc, const void* b, size_t n);
// out = narrow(acc) (round to nearest even); a copy when the types agree and out != acc
void narrow(DType t, void* out, const void* acc, size_t n);
// out = ((s[0] + s[1]) + s[2]) + ...: the fixed rank order of the deterministic mode; out may not alias s.
void sum_ranked(DType t, void* out, std::span<const void* const> srcs, size_t n);
// Software conversions (also used by tests): the shared ones of comm_backends/half.h.
using commsched::bf16_to_f32;
using commsched::f16_to_f32;
using commsched::f32_to_bf16;
using commsched::f32_to_f16;
}  // namespace kernels

// Runs the kernels, in parallel over `threads` oneTBB threads when a range is at least `parallel_bytes` long.
class Summer {
 public:
  Summer(int threads, uint64_t parallel_bytes);
  ~Summer();
  Summer(const Summer&) = delete;
  Summer& operator=(const Summer&) = delete;

  void widen(DType t, void* acc, const void* a, size_t n);
  void add2(DType t, void* acc, const void* a, const void* b, size_t n);
  void add(DType t, void* acc, const void* b, size_t n);
  void narrow(DType t, void* out, const void* acc, size_t n);
  void sum_ranked(DType t, void* out, std::span<const void* const> srcs, size_t n);

 private:
  template <typename Fn>
  void run(DType t, size_t n, Fn&& fn);
  uint64_t parallel_bytes_;
  struct Arena;  // oneTBB arena, kept out of this header
  std::unique_ptr<Arena> arena_;
};

}  // namespace commsched::ps
