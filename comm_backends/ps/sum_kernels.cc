#include "comm_backends/ps/sum_kernels.h"

#include "scheduler/tsan_handoff.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace commsched::ps {

struct Summer::Arena {
  tbb::task_arena arena;
  explicit Arena(int threads) : arena(threads) {}
};

Summer::Summer(int threads, uint64_t parallel_bytes)
    : parallel_bytes_(std::max<uint64_t>(parallel_bytes, 64 * 1024)),
      arena_(std::make_unique<Arena>(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()))) {}
Summer::~Summer() = default;

// Splits [0, n) into chunks of about parallel_bytes_ / 2 (in data bytes) and runs fn(begin, count) on each.
template <typename Fn>
void Summer::run(DType t, size_t n, Fn&& fn) {
  const size_t bytes = n * dtype_size(t);
  if (bytes < parallel_bytes_ || arena_->arena.max_concurrency() <= 1) {
    fn(size_t{0}, n);
    return;
  }
  const size_t grain = std::max<size_t>(4096, parallel_bytes_ / 2 / dtype_size(t));
  // The tasks read our stack and the caller reuses it afterwards; oneTBB's hand-offs are invisible to TSan.
  const char start = 0, finish = 0;
  handed_over(&start);
  arena_->arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, grain), [&](const tbb::blocked_range<size_t>& r) {
      taken_over(&start);
      fn(r.begin(), r.end() - r.begin());
      handed_over(&finish);
    });
  });
  taken_over(&finish);
}

void Summer::widen(DType t, void* acc, const void* a, size_t n) {
  const size_t ae = accumulator_size(t), de = dtype_size(t);
  run(t, n, [&](size_t b, size_t m) {
    kernels::widen(t, static_cast<std::byte*>(acc) + b * ae, static_cast<const std::byte*>(a) + b * de, m);
  });
}
void Summer::add2(DType t, void* acc, const void* a, const void* b2, size_t n) {
  const size_t ae = accumulator_size(t), de = dtype_size(t);
  run(t, n, [&](size_t b, size_t m) {
    kernels::add2(t, static_cast<std::byte*>(acc) + b * ae, static_cast<const std::byte*>(a) + b * de,
                  static_cast<const std::byte*>(b2) + b * de, m);
  });
}
void Summer::add(DType t, void* acc, const void* b2, size_t n) {
  const size_t ae = accumulator_size(t), de = dtype_size(t);
  run(t, n, [&](size_t b, size_t m) {
    kernels::add(t, static_cast<std::byte*>(acc) + b * ae, static_cast<const std::byte*>(b2) + b * de, m);
  });
}
void Summer::narrow(DType t, void* out, const void* acc, size_t n) {
  const size_t ae = accumulator_size(t), de = dtype_size(t);
  run(t, n, [&](size_t b, size_t m) {
    kernels::narrow(t, static_cast<std::byte*>(out) + b * de, static_cast<const std::byte*>(acc) + b * ae, m);
  });
}
void Summer::sum_ranked(DType t, void* out, std::span<const void* const> srcs, size_t n) {
  const size_t de = dtype_size(t);
  run(t, n, [&](size_t b, size_t m) {
    std::vector<const void*> part(srcs.size());
    for (size_t r = 0; r < srcs.size(); ++r) part[r] = static_cast<const std::byte*>(srcs[r]) + b * de;
    kernels::sum_ranked(t, static_cast<std::byte*>(out) + b * de, part, m);
  });
}

}  // namespace commsched::ps
