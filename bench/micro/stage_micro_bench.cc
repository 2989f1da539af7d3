// Cost of each compression stage per MiB of gradient: encode (with error feedback where the scheme has it) and
// decode, on one core, for a 4 MiB f32 partition (the default partition size).
//   taskset -c 0 build/bench/micro/stage_micro_bench
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "compression/codec.h"

namespace commsched::compression {
namespace {

constexpr uint64_t kElements = (4u << 20) / sizeof(float);

std::vector<float> gradient() {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> g(kElements);
  for (float& v : g) v = d(rng);
  return g;
}

void report_per_mib(benchmark::State& state) {
  const double mib = static_cast<double>(kElements * sizeof(float)) / (1 << 20);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kElements * sizeof(float)));
  // Rate-inverted: seconds per (MiB * 1e-6), i.e. microseconds per MiB.
  state.counters["us_per_MiB"] = benchmark::Counter(static_cast<double>(state.iterations()) * mib * 1e-6,
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_Encode(benchmark::State& state, Spec spec) {
  const std::vector<float> g = gradient();
  std::vector<float> residual(kElements, 0.0f);
  std::vector<std::byte> wire(encoded_bytes(spec, DType::f32, kElements));
  const bool ef = !sums_on_wire(spec.scheme);
  for (auto _ : state) {
    encode(spec, DType::f32, g.data(), kElements, ef ? residual.data() : nullptr, wire.data());
    benchmark::DoNotOptimize(wire.data());
  }
  report_per_mib(state);
  state.counters["wire_ratio"] = static_cast<double>(wire.size()) / (kElements * sizeof(float));
}

void BM_Decode(benchmark::State& state, Spec spec) {
  const std::vector<float> g = gradient();
  std::vector<float> residual(kElements, 0.0f), out(kElements);
  std::vector<std::byte> wire(encoded_bytes(spec, DType::f32, kElements));
  encode(spec, DType::f32, g.data(), kElements, sums_on_wire(spec.scheme) ? nullptr : residual.data(), wire.data());
  for (auto _ : state) {
    decode(spec, DType::f32, wire.data(), kElements, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  report_per_mib(state);
}

BENCHMARK_CAPTURE(BM_Encode, fp16, Spec{Scheme::fp16})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, bf16, Spec{Scheme::bf16})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, topk_1pct, Spec{Scheme::topk, 0.01})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, signsgd, Spec{Scheme::signsgd})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, fp16, Spec{Scheme::fp16})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, bf16, Spec{Scheme::bf16})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, topk_1pct, Spec{Scheme::topk, 0.01})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, signsgd, Spec{Scheme::signsgd})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace commsched::compression

BENCHMARK_MAIN();
