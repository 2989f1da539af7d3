// The server's summation: the shared kernels of comm_backends/reduce.h (f16 and bf16 accumulate in f32 and round once
// at the end, so a sum of W pushes has one rounding error, not W), and a Summer that spreads big ranges over a few
// threads of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "comm_backends/reduce.h"
#include "base/types.h"

namespace commsched::ps {

// The kernels are the shared ones of comm_backends/reduce.h (one kernel set for every backend).
using commsched::accumulator_size;
using commsched::needs_narrowing;
namespace kernels = commsched::kernels;

// Runs the kernels, in parallel over `threads` threads (the caller and threads - 1 helpers) when a range is at least
// `parallel_bytes` long. Several threads may call at once; they share the helpers.
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
  int threads_;
  struct Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace commsched::ps
