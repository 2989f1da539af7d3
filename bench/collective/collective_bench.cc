// Gloo all-reduce through commsched's GlooBackend (negotiation + executor + fusion) against plain Gloo on the same
// connected context, for the same bytes, measured side by side in one run.
//
//   collective_bench [--ranks N] [--iters K] [--blocks B]     launches N rank processes on loopback (default 2)
//
// Each case alternates blocks of plain and backend runs (A B A B ...) and reports the median block, so drift on a busy
// machine hits both sides alike. Rank 0 prints a Markdown table.
#include <gloo/barrier.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "comm_backends/gloo/gloo_backend.h"
#include "tests/integration/collective/rank_processes.h"

using namespace commsched;
using Clock = std::chrono::steady_clock;

namespace {

struct Case {
  std::string label;
  int tensors;       // tensors per step (each its own task)
  uint64_t elements;  // f32 elements per tensor
};

// Starts every tensor of one step through the backend and waits for all.
class BackendStep {
 public:
  explicit BackendStep(const Case& c) : data_(c.tensors, std::vector<float>(c.elements, 1.0f)), tasks_(c.tensors) {
    for (int i = 0; i < c.tensors; ++i) {
      TaskDesc& t = tasks_[i];
      t.name = c.label + "." + std::to_string(i);
      t.key = task_key(t.name);
      t.priority = i;
      t.op = Op::allreduce;
      t.dtype = DType::f32;
      t.count = c.elements;
      t.buffer.data = data_[i].data();
      t.num_partitions = 1;
    }
  }
  void run(GlooBackend& backend) {
    std::unique_lock lock(mu_);
    left_ = tasks_.size();
    lock.unlock();
    for (auto& t : tasks_) {
      backend.start({PartitionView{&t, 0, 0, t.bytes()}}, [this](const Status& st) {
        std::lock_guard l(mu_);
        if (!st.ok() && error_.empty()) error_ = st.message;
        if (--left_ == 0) cv_.notify_one();
      });
    }
    lock.lock();
    cv_.wait(lock, [&] { return left_ == 0; });
    if (!error_.empty()) throw std::runtime_error(error_);
    for (auto& t : tasks_) ++t.round;
  }

 private:
  std::vector<std::vector<float>> data_;
  std::vector<TaskDesc> tasks_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t left_ = 0;
  std::string error_;
};

void barrier(GlooBackend& b, uint32_t tag) {
  gloo::BarrierOptions opts(b.context());
  opts.setTag(tag);
  gloo::barrier(opts);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_rank(int iters, int blocks) {
  const ClusterEnv env = ClusterEnv::from_env();
  GlooBackend backend(env);
  const std::vector<Case> cases = {
      {"4KiB", 1, 1024},           {"64KiB", 1, 16 * 1024},     {"1MiB", 1, 256 * 1024},
      {"16MiB", 1, 4 * 1024 * 1024}, {"64x4KiB", 64, 1024},     {"16x64KiB", 16, 16 * 1024},
  };
  // Plain Gloo uses tags far above the backend's counter so the two never collide on the shared context.
  uint32_t plain_tag = 1u << 30;
  if (env.rank == 0) {
    std::printf("| case | bytes/step | plain Gloo (us/step) | GlooBackend (us/step) | ratio |\n");
    std::printf("|---|---:|---:|---:|---:|\n");
  }
  for (const Case& c : cases) {
    std::vector<std::vector<float>> plain(c.tensors, std::vector<float>(c.elements, 1.0f));
    BackendStep step(c);
    const int n = c.elements >= (1u << 22) ? std::max(2, iters / 10) : iters;
    std::vector<double> plain_us, backend_us;
    for (int b = 0; b < blocks; ++b) {
      barrier(backend, plain_tag++);
      auto t0 = Clock::now();
      for (int i = 0; i < n; ++i)
        for (auto& v : plain) gloo_allreduce_sum(backend.context(), v.data(), DType::f32, v.size(), plain_tag++);
      plain_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
      barrier(backend, plain_tag++);
      t0 = Clock::now();
      for (int i = 0; i < n; ++i) step.run(backend);
      backend_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
    }
    const double p = median(plain_us), q = median(backend_us);
    if (env.rank == 0)
      std::printf("| %s | %s | %.1f | %.1f | %.2f |\n", c.label.c_str(),
                  std::to_string(c.tensors * c.elements * 4).c_str(), p, q, q / p);
    std::fflush(stdout);
  }
  if (env.rank == 0) {
    const auto s = backend.negotiation_stats();
    std::printf("\nrank 0 negotiation: %llu partitions, %llu reported by cache id, %llu collectives\n",
                static_cast<unsigned long long>(s.submitted), static_cast<unsigned long long>(s.cached_reports),
                static_cast<unsigned long long>(s.groups));
  }
  backend.shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, iters = 200, blocks = 5;
  bool is_rank = false;
  std::vector<std::string> pass;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : throw std::invalid_argument(a + " needs a value"); };
    if (a == "--ranks") ranks = std::stoi(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--blocks") blocks = std::stoi(next());
    else if (a == "--rank-process") is_rank = true;
    else {
      std::cerr << "usage: collective_bench [--ranks N] [--iters K] [--blocks B]\n";
      return 64;
    }
  }
  try {
    if (is_rank) return run_rank(iters, blocks);
    std::printf("Gloo allreduce (f32 sum), %d ranks on loopback, %d steps per block, median of %d blocks\n\n", ranks,
                iters, blocks);
    std::fflush(stdout);
    testing::RankProcesses procs("/proc/self/exe", {"--rank-process", "--iters", std::to_string(iters), "--blocks",
                                                    std::to_string(blocks)},
                                 ranks);
    int rc = 0;
    for (const auto& e : procs.wait(std::chrono::seconds(600)))
      if (!e.exited || e.code != 0) {
        std::cerr << "rank " << e.rank << " failed (" << (e.exited ? "exit " : "signal ") << e.code << ")\n";
        rc = 1;
      }
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "collective_bench: " << e.what() << "\n";
    return 1;
  }
}
