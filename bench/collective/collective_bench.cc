// Gloo all-reduce through commsched's GlooBackend (negotiation + executor + fusion) against plain Gloo on the same
// connected context, for the same bytes, measured side by side in one run.
//
//   collective_bench [--ranks N] [--iters K] [--blocks B] [--case LABEL]... [--breakdown] [--wait-spin US] [--no-help]
//
// launches N rank processes on loopback (default 2); --case (repeatable) runs only the named cases (4KiB, 64KiB, 1MiB,
// 16MiB, 64x4KiB, 16x64KiB); --breakdown also prints where each rank's backend step goes (negotiation, collectives,
// hand-back to the caller), what each side costs the rank process in context switches and CPU time per step, and the
// median and 90th percentile of single steps (a wait for a core shows as a tail, a cost on every step as a shift).
// --wait-spin US makes the caller poll for its step's completion up to US microseconds before it waits as usual
// (CompletionWaiter, which polls 50 us): whether the excess over plain Gloo is the caller's wake-up at the end of a
// collective longer than that, which on an idle machine may have to wake a halted core.
// By default the caller waits as a user's synchronize() does: it receives the order and runs its own collectives
// (BackendCapabilities::wait_helper); --no-help makes it sleep while the negotiator thread runs them (as before).
//
// Each case alternates blocks of plain and backend runs (A B A B ...) and reports the median block, so drift on a busy
// machine hits both sides alike. Each block also times a plain Gloo allreduce of 4 bytes: a small-message round trip
// between the ranks under the same load, the unit of the negotiation's inherent cost (the target: a negotiated
// collective costs at most one such round trip more than plain Gloo). Rank 0 prints a Markdown table.
// compare_builds.py beside this file runs two builds of it alternately (before/after a change) and summarises runs.
#include <gloo/barrier.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "base/cpu_usage.h"
#include "comm_backends/gloo/gloo_backend.h"
#include "plugins/launch/process_group.h"
#include "scheduler/completion_waiter.h"
#include "scheduler/global_order.h"
#include "scheduler/policy_factory.h"
#include "scheduler/spin_wait.h"

using namespace commsched;
using Clock = std::chrono::steady_clock;

namespace {

struct Case {
  std::string label;
  int tensors;       // tensors per step (each its own task)
  uint64_t elements;  // f32 elements per tensor
};

// GlooBackend with timestamps around execute(), so a step splits into negotiation (start() until the first collective
// begins), the collectives themselves, and the hand-back (last collective done until the caller wakes).
class TimedGlooBackend : public GlooBackend {
 public:
  using GlooBackend::GlooBackend;
  Clock::time_point first_execute{}, last_done{};
  std::thread::id caller{};                             // the thread that waits for the step
  std::atomic<uint64_t> groups_on_caller{0}, groups{0};  // collectives run, and how many on the waiting caller

 protected:
  void execute(std::span<const PartitionView> group, GroupDone done) override {
    const auto now = Clock::now();
    ++groups;
    if (std::this_thread::get_id() == caller) ++groups_on_caller;
    if (first_execute == Clock::time_point{}) first_execute = now;  // the executor thread only: no race
    GlooBackend::execute(group, [this, &done](const Status& st) {
      last_done = Clock::now();
      done(st);  // the caller is woken by this: last_done is written before
    });
  }
};

// Microseconds per step spent in each phase, summed over a block.
struct Breakdown {
  double negotiate = 0, collective = 0, hand_back = 0;
};

// The value below which a fraction q of the samples lie.
double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// Starts every tensor of one step through the backend and waits for all.
class BackendStep {
 public:
  explicit BackendStep(const Case& c)
      : label_(c.label), data_(c.tensors, std::vector<float>(c.elements, 1.0f)), tasks_(c.tensors) {
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
  // Returns the step's microseconds. The caller polls for completion up to `spin` before it waits.
  double run(TimedGlooBackend& backend, Breakdown& phases, std::chrono::microseconds spin, bool help) {
    waiter_.reset();
    backend.first_execute = {};
    backend.caller = std::this_thread::get_id();
    const auto t0 = Clock::now();
    for (auto& t : tasks_) backend.start({PartitionView{&t, 0, 0, t.bytes()}}, waiter_.callback());
    spin_until([&] { return waiter_.outstanding() == 0; }, spin);
    // A peer lost mid-step fails the batch well within this; the limit only turns a bug into an error.
    const Status st = waiter_.wait(std::chrono::seconds(120), 0, help ? backend.capabilities().wait_helper : nullptr);
    const auto t1 = Clock::now();
    if (!st.ok()) throw std::runtime_error("GlooBackend step of case " + label_ + ": " + st.message);
    using us = std::chrono::duration<double, std::micro>;
    phases.negotiate += us(backend.first_execute - t0).count();
    phases.collective += us(backend.last_done - backend.first_execute).count();
    phases.hand_back += us(t1 - backend.last_done).count();
    for (auto& t : tasks_) ++t.round;
    return us(t1 - t0).count();
  }

 private:
  std::string label_;
  std::vector<std::vector<float>> data_;
  std::vector<TaskDesc> tasks_;
  CompletionWaiter waiter_;
};

void barrier(TimedGlooBackend& b, uint32_t tag) {
  gloo::BarrierOptions opts(b.context());
  opts.setTag(tag);
  gloo::barrier(opts);
}

// Voluntary context switches of this process so far: every thread wake-up on the critical path is one, and on a busy
// machine each can cost a scheduler slice, so they explain timings that wall-clock noise hides.
long context_switches() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw;
}

// Context switches and CPU time of this process over one side of a block.
struct Usage {
  long csw = 0;
  double cpu = 0;
  // CPU time is what the negotiation, its hand-offs and its spins add to a step, which unlike wall time does not grow
  // with the load from other processes.
  static Usage now() { return {context_switches(), process_cpu_s(/*children=*/false) * 1e6}; }
  void add_since(const Usage& start) {
    const Usage end = now();
    csw += end.csw - start.csw;
    cpu += end.cpu - start.cpu;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  int ranks = 2, iters = 200, blocks = 5;
  std::vector<std::string> only;  // --case: these cases only
  bool breakdown = false;
  std::chrono::microseconds wait_spin{0};
  bool help = true;  // --no-help: the caller sleeps while the negotiator thread runs its collectives
};

int run_rank(const Options& o) {
  const int iters = o.iters, blocks = o.blocks;
  const std::vector<std::string>& only = o.only;
  const ClusterEnv env = ClusterEnv::from_env();
  TimedGlooBackend backend(env);
  // The policy an engine would hand over (COMMSCHED_POLICY and its options): rank 0 orders with it.
  backend.capabilities().global_order->adopt(make_policy(EngineConfig::from_env()));
  const std::vector<Case> cases = {
      {"4KiB", 1, 1024},           {"64KiB", 1, 16 * 1024},     {"1MiB", 1, 256 * 1024},
      {"16MiB", 1, 4 * 1024 * 1024}, {"64x4KiB", 64, 1024},     {"16x64KiB", 16, 16 * 1024},
  };
  // Plain Gloo uses tags far above the backend's counter so the two never collide on the shared context.
  uint32_t plain_tag = 1u << 30;
  if (env.rank == 0) {
    std::printf("| case | bytes/step | plain Gloo (us/step) | GlooBackend (us/step) | ratio | round trip (us) | "
                "excess in round trips |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  }
  std::vector<std::string> phase_lines;
  for (const Case& c : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.label) == only.end()) continue;
    std::vector<std::vector<float>> plain(c.tensors, std::vector<float>(c.elements, 1.0f));
    BackendStep step(c);
    const int n = c.elements >= (1u << 22) ? std::max(2, iters / 10) : iters;
    std::vector<double> plain_us, backend_us, rtt_us;
    std::vector<double> plain_steps, backend_steps;  // single steps, us
    float probe = 1.0f;
    std::vector<Breakdown> phases(blocks);
    Usage plain_use, backend_use;
    backend.groups = 0;
    backend.groups_on_caller = 0;
    for (int b = 0; b < blocks; ++b) {
      barrier(backend, plain_tag++);
      Usage start = Usage::now();
      auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        const auto s0 = Clock::now();
        for (auto& v : plain) gloo_allreduce_sum(backend.context(), v.data(), DType::f32, v.size(), plain_tag++);
        plain_steps.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
      }
      plain_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
      plain_use.add_since(start);
      t0 = Clock::now();
      for (int i = 0; i < n; ++i) gloo_allreduce_sum(backend.context(), &probe, DType::f32, 1, plain_tag++);
      rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
      barrier(backend, plain_tag++);
      start = Usage::now();
      t0 = Clock::now();
      for (int i = 0; i < n; ++i) backend_steps.push_back(step.run(backend, phases[b], o.wait_spin, o.help));
      backend_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
      backend_use.add_since(start);
    }
    const double p = median(plain_us), q = median(backend_us), rtt = median(rtt_us);
    if (env.rank == 0)
      std::printf("| %s | %s | %.1f | %.1f | %.2f | %.1f | %.2f |\n", c.label.c_str(),
                  std::to_string(c.tensors * c.elements * 4).c_str(), p, q, q / p, rtt, (q - p) / rtt);
    std::fflush(stdout);
    // Phases of the median backend block.
    const size_t m = std::distance(backend_us.begin(), std::find(backend_us.begin(), backend_us.end(), q));
    char line[320];
    const double steps = static_cast<double>(n) * blocks;
    std::snprintf(line, sizeof line,
                  "| %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f | %.1f / %.1f | %.0f%% |\n",
                  env.rank, c.label.c_str(), phases[m].negotiate / n, phases[m].collective / n,
                  phases[m].hand_back / n, q, plain_use.csw / steps, backend_use.csw / steps, plain_use.cpu / steps,
                  backend_use.cpu / steps, percentile(plain_steps, 0.5), percentile(plain_steps, 0.9),
                  percentile(backend_steps, 0.5), percentile(backend_steps, 0.9),
                  100.0 * static_cast<double>(backend.groups_on_caller) / static_cast<double>(std::max<uint64_t>(1, backend.groups)));
    phase_lines.push_back(line);
  }
  if (o.breakdown) {
    // Rank by rank, separated by barriers, so the lines do not interleave on the shared stdout.
    if (env.rank == 0)
      std::printf("\nGlooBackend step phases (median block; us/step): negotiation = start() until the first collective "
                  "begins, collectives, hand-back = last collective done until the caller wakes; csw = voluntary "
                  "context switches and cpu = CPU time (us, user + system, all threads) of the rank process per "
                  "step (mean), plain Gloo and GlooBackend; single steps = median / 90th percentile of every step (us); on caller = "
                  "collectives run on the waiting caller's own thread (the rest on the negotiator thread)\n\n"
                  "| rank | case | negotiation | collectives | hand-back | step | csw plain | csw backend | cpu plain | "
                  "cpu backend | plain steps p50 / p90 | backend steps p50 / p90 | on caller |\n"
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int r = 0; r < env.num_workers; ++r) {
      std::fflush(stdout);
      barrier(backend, plain_tag++);
      if (r == env.rank)
        for (const auto& l : phase_lines) std::fputs(l.c_str(), stdout);
      std::fflush(stdout);
    }
    barrier(backend, plain_tag++);
  }
  if (env.rank == 0) {
    const auto s = backend.negotiation_stats();
    std::printf("\nrank 0 negotiation: %llu partitions, %llu reported by cache id, %llu ordered on rank 0's readiness "
                "alone (vouched), %llu collectives\n",
                static_cast<unsigned long long>(s.submitted), static_cast<unsigned long long>(s.cached_reports),
                static_cast<unsigned long long>(s.vouched), static_cast<unsigned long long>(s.groups));
  }
  backend.shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool is_rank = false;
  for (int i = 1; i < argc; ++i) try {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : throw std::invalid_argument(a + " needs a value"); };
    auto number = [&]() -> int64_t {
      const std::string v = next();
      size_t used = 0;
      int64_t n = -1;
      try {
        n = std::stoll(v, &used);
      } catch (const std::exception&) {
      }
      if (used != v.size() || n < 0) throw std::invalid_argument(a + " takes a whole number >= 0, not '" + v + "'");
      return n;
    };
    if (a == "--ranks") o.ranks = static_cast<int>(number());
    else if (a == "--iters") o.iters = static_cast<int>(number());
    else if (a == "--blocks") o.blocks = static_cast<int>(number());
    else if (a == "--case") o.only.push_back(next());
    else if (a == "--breakdown") o.breakdown = true;
    else if (a == "--wait-spin") o.wait_spin = std::chrono::microseconds(number());
    else if (a == "--no-help") o.help = false;
    else if (a == "--rank-process") is_rank = true;
    else {
      std::cerr << "usage: collective_bench [--ranks N] [--iters K] [--blocks B] [--case LABEL]... [--breakdown] "
                   "[--wait-spin US] [--no-help]\n";
      return 64;
    }
  } catch (const std::exception& e) {
    std::cerr << "collective_bench: " << e.what() << "\n";
    return 64;
  }
  try {
    if (is_rank) return run_rank(o);
    std::printf("Gloo allreduce (f32 sum), %d ranks on loopback, %d steps per block, median of %d blocks%s%s\n\n", o.ranks,
                o.iters, o.blocks,
                (o.wait_spin.count() ? (", caller polls " + std::to_string(o.wait_spin.count()) + " us").c_str() : ""),
                o.help ? "" : ", the caller does not help");
    std::fflush(stdout);
    std::vector<std::string> args = {"--rank-process", "--iters", std::to_string(o.iters), "--blocks",
                                     std::to_string(o.blocks), "--wait-spin", std::to_string(o.wait_spin.count())};
    for (const auto& c : o.only) args.insert(args.end(), {"--case", c});
    if (o.breakdown) args.push_back("--breakdown");
    if (!o.help) args.push_back("--no-help");
    RankProcesses procs("/proc/self/exe", args, o.ranks);
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
