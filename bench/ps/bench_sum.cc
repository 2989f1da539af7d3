// Summation throughput per thread (the shared kernels of comm_backends/reduce.h) against a plain memory-bandwidth loop
// moving the same bytes.
//   BM_Sum/<dtype>:    acc = a + b (the streaming mode's first step; f16/bf16 widen to an f32 accumulator)
//   BM_SumPair/<dtype>: a = a + b in the data type (Gloo's reduction and the loopback backend; f16/bf16 round once)
//   BM_SummerAdd/<threads>/<KiB>: acc += b in f32 through the server's Summer (threads = the caller + helpers), one
//                       partition of <KiB>, parallel from 1 MiB as the server's default: what spreading one partition over cores gains or costs
//   BM_MemLoop/<bytes>: out[i] = a[i] ^ b[i] on 64-bit words with the same read/write traffic per call
// Bytes/s counts every byte read and written, so the two are directly comparable (target ratio >= 0.7).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "comm_backends/ps/sum_kernels.h"

using namespace commsched;
using namespace commsched::ps;

namespace {

constexpr size_t kElems = 4 << 20;  // 4 Mi elements: well beyond the caches

void BM_Sum(benchmark::State& st) {
  const auto t = static_cast<DType>(st.range(0));
  const size_t es = dtype_size(t), as = accumulator_size(t);
  std::vector<std::byte> a(kElems * es, std::byte{1}), b(kElems * es, std::byte{2}), acc(kElems * as);
  for (auto _ : st) {
    kernels::add2(t, acc.data(), a.data(), b.data(), kElems);
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * kElems * (2 * es + as)));
  st.SetLabel(std::string(dtype_name(t)));
}

void BM_SumInPlace(benchmark::State& st) {  // acc += b: every later push in streaming mode
  const auto t = static_cast<DType>(st.range(0));
  const size_t es = dtype_size(t), as = accumulator_size(t);
  std::vector<std::byte> b(kElems * es, std::byte{2}), acc(kElems * as, std::byte{0});
  for (auto _ : st) {
    kernels::add(t, acc.data(), b.data(), kElems);
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * kElems * (es + 2 * as)));
  st.SetLabel(std::string(dtype_name(t)));
}

void BM_SumPair(benchmark::State& st) {
  const auto t = static_cast<DType>(st.range(0));
  const size_t es = dtype_size(t);
  std::vector<std::byte> a(kElems * es, std::byte{0}), b(kElems * es, std::byte{0});
  for (auto _ : st) {
    kernels::sum_pair(t, a.data(), a.data(), b.data(), kElems);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * kElems * 3 * es));
  st.SetLabel(std::string(dtype_name(t)));
}

void BM_SummerAdd(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const size_t n = static_cast<size_t>(st.range(1)) * 1024 / 4;
  Summer summer(threads, 1 << 20);  // the server's default COMMSCHED_PS_PARALLEL_SUM_BYTES
  std::vector<float> b(n, 2.0f), acc(n, 0.0f);
  for (auto _ : st) {
    summer.add(DType::f32, acc.data(), b.data(), n);
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * n * 12));
}

// The reference: the same traffic as BM_Sum (read 2 x in_bytes, write out_bytes) with no arithmetic to speak of.
void BM_MemLoop(benchmark::State& st) {
  const size_t in_bytes = static_cast<size_t>(st.range(0)), out_bytes = static_cast<size_t>(st.range(1));
  std::vector<uint64_t> a(in_bytes / 8, 1), b(in_bytes / 8, 2), out(out_bytes / 8);
  const size_t n = out.size(), step = a.size() == n ? 1 : 0;  // same-size arrays, or half-size inputs
  for (auto _ : st) {
    if (step) {
      for (size_t i = 0; i < n; ++i) out[i] = a[i] ^ b[i];
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = a[i / 2] ^ b[i / 2];
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * (2 * in_bytes + out_bytes)));
}

}  // namespace

BENCHMARK(BM_Sum)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);         // f32, f64, f16, bf16
BENCHMARK(BM_SumInPlace)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SumPair)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SummerAdd)->ArgsProduct({{1, 2}, {1024, 4096, 65536}})->UseRealTime();
BENCHMARK(BM_MemLoop)->Args({kElems * 4, kElems * 4})->Args({kElems * 8, kElems * 8})->Args({kElems * 2, kElems * 4})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
