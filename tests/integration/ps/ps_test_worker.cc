// Test process for the parameter-server integration tests. With COMMSCHED_ROLE=server it runs a server; otherwise a
// worker that drives PsBackend directly (no engine): it submits batches with start() and waits on `done`.
//
//   ps_test_worker [--tensors N] [--iterations I] [--max-bytes B] [--seed S]
//                  [--mode exact|random|loop|mismatch|engine|tune|join|land|land-shutdown]
//                  [--out FILE] [--ready FILE] [--tag ANY] [--slow-rank R --slow-ms M] [--hold-file FILE]
// --hold-file: exact, random and loop workers wait until FILE exists before their first iteration (up to 60 s), so a
//           test decides when the run may end (the servers live until it has seen what it waits for).
// exact:    integer-valued data of every dtype; checks every sum exactly; broadcast from rank 0 first.
// random:   random f32/f16/bf16/f64 data; writes an FNV hash of all results to --out (determinism test).
// loop:     like exact but iterates until something fails (kill tests); touches --ready after the first iteration.
// mismatch: worker 1 submits one tensor with a different size; expects an error naming the key.
// engine:   like exact, through an Engine with PriorityCreditPolicy whose credit is a single partition (stall guard
//           off), and every worker ranks the tensors in a different order: each worker's credit holds partitions the
//           others send last. This completes only because the PS acknowledges receipt and credit is released then.
// tune:     like engine (credit 1 MiB), with the online auto-tuner switching partition size and credit live every
//           few iterations (rank 0 decides, the decision is broadcast through the PS); sums must stay exact and
//           every worker must end with the same knobs, which it prints.
// join:     like engine, but worker r runs --iterations + r iterations and then joins: in iteration it the workers
//           that already joined count as zeros. join() must name the last rank as the one that joined last; then
//           every worker runs one more iteration of the same tensors (rounds line up again) and sums over all.
// land:     --tensors f32 tensors of --max-bytes, one partition each (big enough for UCX's rendezvous, whose
//           answers land in the tensor), each its own batch, in a loop until something fails (kill tests; touches
//           --ready after the first iteration). A failed batch's tensor is overwritten with a poison pattern in its
//           callback, and once the backend is destroyed every poisoned tensor must still hold it: nothing may be
//           written into a tensor after its request completed.
// land-shutdown: like land for --iterations iterations, then one more round submitted and shut down at once, with the
//           answers in flight; the same poison check for the requests the shutdown cancelled, exact sums for the
//           others.
// Exit codes: 0 ok, 1 wrong sums, 3 a batch failed (message on stderr), 4 bad usage, 5 a tensor written after its
// request completed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/ps/ps_backend.h"
#include "comm_backends/ps/server.h"
#include "comm_backends/ps/sum_kernels.h"
#include "plugins/api/live_tuner.h"
#include "scheduler/completion_waiter.h"
#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/task.h"

using namespace commsched;

namespace {

struct Options {
  int tensors = 200;
  int iterations = 5;
  uint64_t max_bytes = 8ull << 20;
  uint64_t seed = 1;
  std::string mode = "exact";
  std::string out, ready;
  int slow_rank = -1;  // this worker computes --slow-ms longer before each iteration (a slow but live worker)
  int slow_ms = 0;
  std::string hold_file;
};

struct Tensor {
  TaskDesc desc;
  std::vector<std::byte> data;
};

// Small integers, exact in every dtype even after summing 4 workers (bf16 is exact up to 256).
int value_of(int rank, size_t tensor, size_t elem, int iter) {
  return static_cast<int>((rank * 5 + tensor * 3 + elem * 7 + static_cast<size_t>(iter)) % 9) - 4;
}

void store(DType t, std::byte* p, double v) {
  switch (t) {
    case DType::f32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case DType::f64: std::memcpy(p, &v, 8); break;
    case DType::f16: { uint16_t x = ps::kernels::f32_to_f16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case DType::bf16: { uint16_t x = ps::kernels::f32_to_bf16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case DType::i32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DType::i64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
  }
}
double load(DType t, const std::byte* p) {
  switch (t) {
    case DType::f32: { float x; std::memcpy(&x, p, 4); return x; }
    case DType::f64: { double x; std::memcpy(&x, p, 8); return x; }
    case DType::f16: { uint16_t x; std::memcpy(&x, p, 2); return ps::kernels::f16_to_f32(x); }
    case DType::bf16: { uint16_t x; std::memcpy(&x, p, 2); return ps::kernels::bf16_to_f32(x); }
    case DType::i32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::i64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
  }
  return 0;
}

// Same sizes and dtypes on every worker (same seed): log-uniform from 1 byte to max_bytes, every dtype in turn.
std::vector<Tensor> make_tensors(const Options& o, int rank, bool random_floats) {
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> logsize(0.0, std::log(static_cast<double>(o.max_bytes)));
  const DType floats[] = {DType::f32, DType::f16, DType::bf16, DType::f64};
  std::vector<Tensor> ts(static_cast<size_t>(o.tensors));
  for (size_t i = 0; i < ts.size(); ++i) {
    TaskDesc& d = ts[i].desc;
    d.dtype = random_floats ? floats[i % 4] : static_cast<DType>(i % kNumDTypes);
    const uint64_t bytes = static_cast<uint64_t>(std::exp(logsize(rng)));
    d.count = std::max<uint64_t>(1, bytes / dtype_size(d.dtype));
    if (o.mode == "mismatch" && i == 0) d.count = rank == 1 ? 1003 : 1000;  // one partition either way
    d.name = "tensor." + std::to_string(i);
    d.key = task_key(d.name);
    d.op = Op::push_pull;
    d.id = i;
    ts[i].data.resize(d.bytes());
    d.buffer.data = ts[i].data.data();
  }
  return ts;
}

// Submits every partition of `ts` (batches of up to `per_batch` partitions) and waits for all of them.
Status run_round(CommBackend& b, std::vector<Tensor>& ts, uint64_t partition_bytes, size_t per_batch = 3) {
  CompletionWaiter waiter;
  std::vector<PartitionView> batch;
  auto flush = [&] {
    if (batch.empty()) return;
    b.start(std::move(batch), waiter.callback());
    batch.clear();
  };
  for (auto& t : ts) {
    uint32_t idx = 0;
    for (auto r : partition_ranges(t.desc.count, t.desc.dtype, partition_bytes)) {
      batch.push_back(PartitionView{&t.desc, idx++, r.offset, r.bytes});
      if (batch.size() == per_batch) flush();
    }
  }
  flush();
  // Bounded: a PS failure completes every batch with an error well inside this (peer loss within seconds).
  return waiter.wait(std::chrono::minutes(5));
}

int fail(const Status& st, int rank) {
  std::cerr << "worker " << rank << ": FAILED (" << static_cast<int>(st.code) << "): " << st.message << std::endl;
  return 3;
}

int broadcast_check(CommBackend& b, int rank) {
  Tensor t;
  t.desc.name = "bcast.init";
  t.desc.key = task_key(t.desc.name);
  t.desc.op = Op::broadcast;
  t.desc.dtype = DType::f32;
  t.desc.count = 300000;
  t.data.resize(t.desc.bytes());
  t.desc.buffer.data = t.data.data();
  for (uint64_t i = 0; i < t.desc.count; ++i) store(DType::f32, t.data.data() + 4 * i, rank == 0 ? double(i % 1000) : -1.0);
  std::vector<Tensor> one;
  one.push_back(std::move(t));
  one[0].desc.buffer.data = one[0].data.data();
  if (Status st = run_round(b, one, 256 * 1024); !st.ok()) return fail(st, rank);
  for (uint64_t i = 0; i < one[0].desc.count; ++i)
    if (load(DType::f32, one[0].data.data() + 4 * i) != double(i % 1000)) {
      std::cerr << "worker " << rank << ": broadcast element " << i << " wrong" << std::endl;
      return 1;
    }
  return 0;
}

// Sets integer-valued data for iteration `it` of every tensor.
void fill(std::vector<Tensor>& ts, int rank, int it) {
  for (size_t i = 0; i < ts.size(); ++i) {
    auto& t = ts[i];
    t.desc.round = t.desc.iteration = static_cast<uint64_t>(it);
    const size_t es = dtype_size(t.desc.dtype);
    for (uint64_t e = 0; e < t.desc.count; ++e) store(t.desc.dtype, t.data.data() + e * es, value_of(rank, i, e, it));
  }
}

// Returns 0 when every element of every tensor holds the sum over the workers [first, workers) for iteration `it`
// (the workers below `first` have joined: they count as zeros).
int check_sums(const std::vector<Tensor>& ts, int rank, int workers, int it, int first = 0) {
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    const size_t es = dtype_size(t.desc.dtype);
    for (uint64_t e = 0; e < t.desc.count; ++e) {
      double want = 0;
      for (int r = first; r < workers; ++r) want += value_of(r, i, e, it);
      if (const double got = load(t.desc.dtype, t.data.data() + e * es); got != want) {
        std::cerr << "worker " << rank << ": " << t.desc.name << " (" << dtype_name(t.desc.dtype) << ") element " << e
                  << " is " << got << ", expected " << want << " (iteration " << it << ")" << std::endl;
        return 1;
      }
    }
  }
  return 0;
}

int run_engine_worker(const Options& o) {
  const ClusterEnv env = ClusterEnv::from_env();
  const int rank = env.rank;
  constexpr uint64_t kPart = 64 * 1024;
  const bool tune = o.mode == "tune", join = o.mode == "join";
  EngineConfig cfg;
  cfg.knobs = tune ? Knobs{256 << 10, 1 << 20} : Knobs{kPart, kPart};
  auto backend = std::make_shared<PsBackend>(env, PsConfig::from_env());
  Engine engine(std::make_unique<PriorityCreditPolicy>(cfg.knobs.credit_bytes, 0, /*stall_guard=*/false), backend, cfg);
  std::unique_ptr<LiveTuner> live;
  if (tune) {
    tuner::TunerOptions to;
    to.max_trials = to.min_trials = 5;
    to.initial_points = 3;
    to.warmup_iterations = 0;
    to.window_iterations = 1;
    to.windows_per_trial = 1;
    to.reuse_best = false;
    // One tuning pass: re-tuning on drift would restart it whenever a loaded machine's throughput moves by 25%
    // within these few iterations, and finished() would stay false.
    to.drift_threshold = 0;
    live = std::make_unique<LiveTuner>(engine, tuner::TuningKey{7, env.num_workers, env.num_servers, "ps"}, to);
  }
  auto ts = make_tensors(o, rank, false);
  const int n = static_cast<int>(ts.size());
  auto last = std::chrono::steady_clock::now();
  const int my_iterations = o.iterations + (join ? rank : 0);
  for (int it = 0; it < my_iterations + (join ? 1 : 0); ++it) {
    if (join && it == my_iterations) {  // out of data: join, then one more iteration with everybody
      const int last_rank = engine.join();
      std::cout << "joined; last " << last_rank << std::endl;
      if (last_rank != env.num_workers - 1) {
        std::cerr << "worker " << rank << ": join() named " << last_rank << " as last, expected "
                  << env.num_workers - 1 << std::endl;
        return 1;
      }
    }
    // The iteration after the join has the same data on every worker, whatever its own count was.
    const int data_it = join && it == my_iterations ? 1000 : it;
    fill(ts, rank, data_it);
    std::atomic<int> failed{0};
    for (int i = 0; i < n; ++i) {
      Task task;
      task.name = ts[i].desc.name;
      task.op = Op::push_pull;
      task.dtype = ts[i].desc.dtype;
      task.count = ts[i].desc.count;
      task.buffer.data = ts[i].data.data();
      task.priority = (i + rank * n / env.num_workers) % n;  // a different most-urgent tensor on every worker
      task.on_done = [&, name = task.name](const Status& st) {
        if (!st.ok() && failed++ == 0) std::cerr << "worker " << rank << ": " << name << ": " << st.message << std::endl;
      };
      engine.submit(std::move(task));
    }
    engine.backward_done();
    engine.wait_all();
    if (failed) return 3;
    // Joined so far: the workers r whose o.iterations + r iterations ended before `it` (none after the join).
    const int first_live = join && it < my_iterations ? std::max(0, it - o.iterations + 1) : 0;
    if (int rc = check_sums(ts, rank, env.num_workers, data_it, first_live)) return rc;
    if (live) {
      const auto now = std::chrono::steady_clock::now();
      live->on_step(std::chrono::duration<double>(now - last).count());
      last = now;
    }
  }
  if (live) {
    if (!live->finished()) {
      std::cerr << "worker " << rank << ": the tuner did not finish in " << o.iterations << " iterations" << std::endl;
      return 1;
    }
    const Knobs k = engine.knobs();
    std::cout << "final knobs " << k.partition_bytes << " " << k.credit_bytes << std::endl;
  }
  engine.shutdown();
  return 0;
}

constexpr std::byte kPoison{0xa5};

// Modes land and land-shutdown (see the top of the file).
int run_landing_worker(const Options& o) {
  const ClusterEnv env = ClusterEnv::from_env();
  const int rank = env.rank;
  auto backend = std::make_unique<PsBackend>(env, PsConfig::from_env());
  std::vector<Tensor> ts(static_cast<size_t>(o.tensors));
  for (size_t i = 0; i < ts.size(); ++i) {
    TaskDesc& d = ts[i].desc;
    d.dtype = DType::f32;
    d.count = o.max_bytes / 4;
    d.name = "land." + std::to_string(i);
    d.key = task_key(d.name);
    d.op = Op::push_pull;
    ts[i].data.resize(d.bytes());
    d.buffer.data = ts[i].data.data();
  }
  std::mutex mu;
  std::vector<bool> poisoned(ts.size(), false);
  Status failure;
  std::atomic<int> settled{0};
  const bool shutdown_test = o.mode == "land-shutdown";
  for (int it = 0; !shutdown_test || it <= o.iterations; ++it) {
    const bool last = shutdown_test && it == o.iterations;
    fill(ts, rank, it);
    CompletionWaiter waiter;
    settled = 0;
    for (size_t i = 0; i < ts.size(); ++i) {  // every tensor its own batch; a failed one is poisoned in its callback
      waiter.expect(1);
      backend->start({PartitionView{&ts[i].desc, 0, 0, ts[i].desc.bytes()}}, [&, i](const Status& st) {
        if (!st.ok()) {
          std::memset(ts[i].data.data(), static_cast<int>(kPoison), ts[i].data.size());
          std::lock_guard lock(mu);
          poisoned[i] = true;
          if (failure.ok()) failure = st;
        }
        ++settled;
        waiter.settle(Status::Ok());
      });
    }
    if (last) {  // shut down once the first answer is back: the others are on their way
      while (settled == 0) std::this_thread::yield();
      backend->shutdown();
    }
    (void)waiter.wait(std::chrono::minutes(5));
    std::lock_guard lock(mu);
    if (!failure.ok() && !last) break;
    for (size_t i = 0; i < ts.size(); ++i) {
      if (poisoned[i]) continue;
      for (uint64_t e = 0; e < ts[i].desc.count; ++e) {
        double want = 0;
        for (int r = 0; r < env.num_workers; ++r) want += value_of(r, i, e, it);
        if (const double got = load(DType::f32, ts[i].data.data() + 4 * e); got != want) {
          std::cerr << "worker " << rank << ": " << ts[i].desc.name << " element " << e << " is " << got
                    << ", expected " << want << " (iteration " << it << ")" << std::endl;
          return 1;
        }
      }
    }
    if (it == 0 && !o.ready.empty()) std::ofstream(o.ready) << "ready\n";
  }
  backend.reset();  // the transport is closed and UCX is gone: a late write would have happened by now
  size_t hit = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!poisoned[i]) continue;
    ++hit;
    for (size_t b = 0; b < ts[i].data.size(); ++b)
      if (ts[i].data[b] != kPoison) {
        std::cerr << "worker " << rank << ": " << ts[i].desc.name << " byte " << b
                  << " was written after its request completed with '" << failure.message << "'" << std::endl;
        return 5;
      }
  }
  std::cout << "worker " << rank << ": " << hit << " requests failed or cancelled, their tensors untouched after"
            << std::endl;
  if (!shutdown_test) return fail(failure, rank);
  if (!failure.ok() && failure.code != Status::Code::cancelled) return fail(failure, rank);
  return 0;
}

int run_worker(const Options& o) {
  if (o.mode == "engine" || o.mode == "tune" || o.mode == "join") return run_engine_worker(o);
  if (o.mode == "land" || o.mode == "land-shutdown") return run_landing_worker(o);
  const ClusterEnv env = ClusterEnv::from_env();
  PsBackend backend(env, PsConfig::from_env());
  const int rank = env.rank;
  if (o.mode != "random")
    if (int rc = broadcast_check(backend, rank)) return rc;
  auto ts = make_tensors(o, rank, o.mode == "random");
  std::mt19937_64 noise(o.seed * 1000 + static_cast<uint64_t>(rank));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  uint64_t hash = 1469598103934665603ull;
  for (int i = 0; !o.hold_file.empty() && i < 12000 && !std::filesystem::exists(o.hold_file); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (int it = 0; o.mode == "loop" || it < o.iterations; ++it) {
    if (rank == o.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(o.slow_ms));  // "compute"
    if (o.mode == "random") {
      for (auto& t : ts) {
        t.desc.round = t.desc.iteration = static_cast<uint64_t>(it);
        const size_t es = dtype_size(t.desc.dtype);
        for (uint64_t e = 0; e < t.desc.count; ++e) store(t.desc.dtype, t.data.data() + e * es, unit(noise));
      }
    } else {
      fill(ts, rank, it);
    }
    // Partition boundaries change from one iteration to the next.
    const uint64_t part = (it % 2 == 0) ? (1ull << 20) : (384ull << 10);
    // flood: every partition its own message, all of them at once (many workers flooding one server).
    if (Status st = run_round(backend, ts, part, o.mode == "flood" ? 1 : 3); !st.ok()) return fail(st, rank);
    if (o.mode != "random")
      if (int rc = check_sums(ts, rank, env.num_workers, it)) return rc;
    for (const auto& t : ts)
      for (std::byte c : t.data) hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    if (it == 0 && !o.ready.empty()) std::ofstream(o.ready) << "ready\n";
  }
  if (!o.out.empty()) std::ofstream(o.out) << std::hex << hash << "\n";
  backend.shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--tensors") o.tensors = std::stoi(v);
    else if (k == "--iterations") o.iterations = std::stoi(v);
    else if (k == "--max-bytes") o.max_bytes = std::stoull(v);
    else if (k == "--seed") o.seed = std::stoull(v);
    else if (k == "--mode") o.mode = v;
    else if (k == "--out") o.out = v;
    else if (k == "--ready") o.ready = v;
    else if (k == "--slow-rank") o.slow_rank = std::stoi(v);
    else if (k == "--slow-ms") o.slow_ms = std::stoi(v);
    else if (k == "--hold-file") o.hold_file = v;
    else if (k == "--tag") continue;  // lets tests find their processes by command line
    else { std::cerr << "unknown option " << k << std::endl; return 4; }
  }
  try {
    const ClusterEnv env = ClusterEnv::from_env();
    if (env.role == Role::server) return run_server(env, PsConfig::from_env(), /*owns_process=*/true);
    return run_worker(o);
  } catch (const std::exception& e) {
    std::cerr << "ps_test_worker: " << e.what() << std::endl;
    return 3;
  }
}
