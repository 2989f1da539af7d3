#include "comm_backends/ps/sum_kernels.h"

#include "base/cpu_usage.h"
#include "scheduler/spin_wait.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace commsched::ps {

// A fork-join pool of plain threads rather than a oneTBB arena: several shard threads of the server sum at once, and
// every hand-off here goes through a mutex that ThreadSanitizer sees (oneTBB's join happens inside the uninstrumented
// library, which left its workers' last writes to the caller's stack unordered for TSan). Chunks are at least
// parallel_bytes / 2 long, so taking the mutex once per chunk costs nothing measurable. A helper that ran out of work
// polls briefly before it sleeps: partitions arrive back to back, and a wake-up costs about as much as summing a
// 512 KiB chunk (bench/ps/bench_sum.cc BM_SummerAdd: 1 MiB summed in 1.3x the time with sleeping helpers).
constexpr std::chrono::microseconds kHelperSpin{50};
struct Summer::Pool {
  struct Job {
    void (*call)(void* ctx, size_t begin, size_t count);
    void* ctx;
    size_t n, grain, chunks, next = 0, done = 0;
  };
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Job*> jobs;  // jobs with chunks nobody has claimed yet
  std::atomic<size_t> queued{0};  // jobs.size(), for helpers polling without the mutex
  bool stopping = false;
  std::vector<std::thread> threads;

  explicit Pool(int helpers) {
    for (int i = 0; i < helpers; ++i) threads.emplace_back([this] { serve(); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    work_cv.notify_all();
    for (auto& t : threads) t.join();
  }

  // Claims the next chunk of `j` under mu; a job whose last chunk is claimed leaves the queue.
  bool claim(Job& j, size_t& chunk) {
    if (j.next == j.chunks) return false;
    chunk = j.next++;
    if (j.next == j.chunks) {
      jobs.erase(std::find(jobs.begin(), jobs.end(), &j));
      queued.store(jobs.size(), std::memory_order_relaxed);
    }
    return true;
  }
  // Runs one claimed chunk outside the lock and counts it done; the caller waits for the count, so `j` outlives this.
  void work(std::unique_lock<std::mutex>& lock, Job& j, size_t chunk) {
    lock.unlock();
    const size_t begin = chunk * j.grain;
    j.call(j.ctx, begin, std::min(j.grain, j.n - begin));
    lock.lock();
    if (++j.done == j.chunks) done_cv.notify_all();
  }
  void serve() {
    std::unique_lock lock(mu);
    for (;;) {
      if (jobs.empty() && !stopping) {
        lock.unlock();
        spin_until([&] { return queued.load(std::memory_order_relaxed) > 0; }, kHelperSpin);
        lock.lock();
      }
      work_cv.wait(lock, [&] { return stopping || !jobs.empty(); });
      if (stopping) return;
      Job& j = *jobs.front();
      size_t chunk;
      if (claim(j, chunk)) work(lock, j, chunk);
    }
  }
  // The caller works on its own job too, then waits for the chunks the helpers took.
  void run(Job& j) {
    std::unique_lock lock(mu);
    jobs.push_back(&j);
    queued.store(jobs.size(), std::memory_order_relaxed);
    if (j.chunks > 2) work_cv.notify_all(); else work_cv.notify_one();
    size_t chunk;
    while (claim(j, chunk)) work(lock, j, chunk);
    done_cv.wait(lock, [&] { return j.done == j.chunks; });
  }
};

Summer::Summer(int threads, uint64_t parallel_bytes)
    : parallel_bytes_(std::max<uint64_t>(parallel_bytes, 64 * 1024)),
      threads_(threads > 0 ? threads : static_cast<int>(usable_cores())),
      pool_(threads_ > 1 ? std::make_unique<Pool>(threads_ - 1) : nullptr) {}
Summer::~Summer() = default;

// Splits [0, n) into chunks of about parallel_bytes_ / 2 (in data bytes) and runs fn(begin, count) on each.
template <typename Fn>
void Summer::run(DType t, size_t n, Fn&& fn) {
  const size_t bytes = n * dtype_size(t);
  if (bytes < parallel_bytes_ || !pool_) {
    fn(size_t{0}, n);
    return;
  }
  const size_t grain = std::max<size_t>(4096, parallel_bytes_ / 2 / dtype_size(t));
  using F = std::remove_reference_t<Fn>;
  Pool::Job job{[](void* ctx, size_t b, size_t m) { (*static_cast<F*>(ctx))(b, m); }, &fn, n, grain,
                (n + grain - 1) / grain};
  pool_->run(job);
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
