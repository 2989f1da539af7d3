// Engine overhead: the cost per partition of submit → partition → policy → dispatch → completion with a backend that
// completes inline (so only the engine is measured), plus partitioning and policy decisions on their own.
// Run pinned to one core:  taskset -c 0 build/bench/micro/engine_micro_bench
#include <benchmark/benchmark.h>

#include <vector>

#include "base/cpu_usage.h"
#include "scheduler/engine.h"
#include "scheduler/fifo_policy.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

// Completes every batch inline, on the engine's scheduler thread.
class InstantBackend final : public CommBackend {
 public:
  std::string_view name() const override { return "instant"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.carries = OpDeviceSet({Op::push_pull, Op::allreduce, Op::broadcast}, {Device::cpu, Device::cuda});
    return c;
  }
  void do_start(std::vector<PartitionView>, BatchDone /*sent*/, BatchDone done) override { done(Status::Ok()); }
  void shutdown() override {}
};

// state.range(0): partitions per task. Each iteration submits 64 tasks and waits for all of them.
void BM_EnginePerPartition(benchmark::State& state, bool priority) {
  const int64_t parts = state.range(0);
  constexpr int kTasks = 64;
  EngineConfig cfg;
  cfg.knobs.partition_bytes = 4096;
  cfg.knobs.credit_bytes = 64 * 4096;
  std::unique_ptr<Policy> policy;
  if (priority) policy = std::make_unique<PriorityCreditPolicy>(cfg.knobs.credit_bytes, 0, false);
  else policy = std::make_unique<FifoPolicy>();
  Engine engine(std::move(policy), std::make_shared<InstantBackend>(), cfg);
  std::vector<std::vector<float>> bufs(kTasks, std::vector<float>(static_cast<size_t>(parts) * 1024));
  std::vector<std::string> names;
  for (int i = 0; i < kTasks; ++i) names.push_back("layer" + std::to_string(i));
  const double cpu0 = process_cpu_s(/*children=*/false);
  for (auto _ : state) {
    for (int i = 0; i < kTasks; ++i) {
      Task t;
      t.name = names[i];
      t.priority = kTasks - i;
      t.count = bufs[i].size();
      t.buffer.data = bufs[i].data();
      engine.submit(std::move(t));
    }
    engine.wait_all();
  }
  const int64_t per_iter = priority ? kTasks * parts : kTasks;  // FIFO sends whole tensors
  state.SetItemsProcessed(state.iterations() * per_iter);
  state.counters["ns_per_partition"] =
      benchmark::Counter(static_cast<double>(state.iterations() * per_iter), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  // CPU seconds of every thread of the process per partition: on a shared machine other processes' time on the
  // pinned core inflates real time but not this, so it is the figure to compare there.
  state.counters["cpu_ns_per_partition"] =
      (process_cpu_s(/*children=*/false) - cpu0) * 1e9 / static_cast<double>(state.iterations() * per_iter);
}
BENCHMARK_CAPTURE(BM_EnginePerPartition, bytescheduler, true)->Arg(1)->Arg(16)->Arg(256)->UseRealTime()->Repetitions(5)->ReportAggregatesOnly();
BENCHMARK_CAPTURE(BM_EnginePerPartition, wfbp, false)->Arg(1)->UseRealTime()->Repetitions(5)->ReportAggregatesOnly();

void BM_Partitioning(benchmark::State& state) {
  const uint64_t count = 25'000'000;  // a 100 MB f32 tensor
  const uint64_t pbytes = static_cast<uint64_t>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(partition_ranges(count, DType::f32, pbytes));
  state.SetItemsProcessed(state.iterations() * partition_count(count, DType::f32, pbytes));
}
BENCHMARK(BM_Partitioning)->Arg(64 << 10)->Arg(1 << 20);

// Policy decision cost per partition: arrival, poll (dispatch under the credit) and completion.
void BM_PolicyDecision(benchmark::State& state) {
  const int parts = 1024;
  PriorityCreditPolicy policy(16 * 4096, 0, false);
  std::vector<PartRef> refs(parts);
  std::vector<Batch> out;
  uint64_t id = 0;
  for (auto _ : state) {
    for (int i = 0; i < parts; ++i) refs[i] = PartRef{id, static_cast<uint32_t>(i), static_cast<int32_t>(id % 100), id, static_cast<uint64_t>(i) * 4096, 4096};
    policy.on_task_arrived(TaskArrival{id, static_cast<int32_t>(id % 100), id, 4096ull * parts, refs}, 0);
    ++id;
    size_t done = 0;
    while (done < static_cast<size_t>(parts)) {
      out.clear();
      policy.poll(0, out);
      for (const Batch& b : out) {
        policy.on_batch_done(b, 0);
        done += b.size();
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * parts);
}
BENCHMARK(BM_PolicyDecision);

}  // namespace
}  // namespace commsched

BENCHMARK_MAIN();
