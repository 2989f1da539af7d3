#include "comm_backends/reduce.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

namespace commsched {

size_t accumulator_size(DType t) { return needs_narrowing(t) ? 4 : dtype_size(t); }
bool needs_narrowing(DType t) { return t == DType::f16 || t == DType::bf16; }

namespace kernels {

namespace {

#define CS_AVX2 __attribute__((target("avx2,f16c,fma")))
#define CS_INLINE inline __attribute__((always_inline))

// ---- generic loops (same-type accumulators); vectorised by the compiler in both instantiations ----
template <typename T>
CS_INLINE void add2_same(T* __restrict acc, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = a[i] + b[i];
}
template <typename T>
CS_INLINE void add_same(T* __restrict acc, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += b[i];
}

// ---- half types: widen to f32 (bf16 is a shift; f16 uses F16C in the AVX2 path) ----
CS_AVX2 CS_INLINE __m256 load_bf16x8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
CS_AVX2 CS_INLINE __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
CS_AVX2 CS_INLINE void store_f16x8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
CS_AVX2 CS_INLINE void store_bf16x8(uint16_t* p, __m256 v) {
  // Round to nearest even in integer arithmetic; NaNs are quieted by the scalar tail only, so handle them here too.
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, qnan, nan);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

template <bool kF16>
CS_AVX2 CS_INLINE __m256 load_half8(const uint16_t* p) {
  if constexpr (kF16) return load_f16x8(p);
  else return load_bf16x8(p);
}
template <bool kF16>
CS_INLINE float half_to32(uint16_t h) {
  if constexpr (kF16) return f16_to_f32(h);
  else return bf16_to_f32(h);
}

template <bool kF16>
CS_AVX2 void half_op_avx2(int op, float* acc, const uint16_t* a, const uint16_t* b, uint16_t* out, size_t n) {
#define load load_half8<kF16>
#define to32 half_to32<kF16>
  size_t i = 0;
  switch (op) {
    case 0:  // widen
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, load(a + i));
      for (; i < n; ++i) acc[i] = to32(a[i]);
      break;
    case 1:  // add2
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_add_ps(load(a + i), load(b + i)));
      for (; i < n; ++i) acc[i] = to32(a[i]) + to32(b[i]);
      break;
    case 2:  // add
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), load(b + i)));
      for (; i < n; ++i) acc[i] += to32(b[i]);
      break;
    default:  // narrow
      for (; i + 8 <= n; i += 8) {
        if constexpr (kF16) store_f16x8(out + i, _mm256_loadu_ps(acc + i));
        else store_bf16x8(out + i, _mm256_loadu_ps(acc + i));
      }
      for (; i < n; ++i) out[i] = kF16 ? f32_to_f16(acc[i]) : f32_to_bf16(acc[i]);
  }
#undef load
#undef to32
}

template <bool kF16>
void half_op_scalar(int op, float* acc, const uint16_t* a, const uint16_t* b, uint16_t* out, size_t n) {
  auto to32 = [](uint16_t h) { return kF16 ? f16_to_f32(h) : bf16_to_f32(h); };
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case 0: acc[i] = to32(a[i]); break;
      case 1: acc[i] = to32(a[i]) + to32(b[i]); break;
      case 2: acc[i] += to32(b[i]); break;
      default: out[i] = kF16 ? f32_to_f16(acc[i]) : f32_to_bf16(acc[i]);
    }
  }
}

template <typename T>
CS_AVX2 void same_op_avx2(int op, T* acc, const T* a, const T* b, size_t n) {
  if (op == 1) add2_same(acc, a, b, n);
  else add_same(acc, b, n);
}
template <typename T>
void same_op_scalar(int op, T* acc, const T* a, const T* b, size_t n) {
  if (op == 1) add2_same(acc, a, b, n);
  else add_same(acc, b, n);
}

bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                          __builtin_cpu_supports("fma");
  return yes;
}

// Calls go(static_cast<T*>(nullptr)) with T the C++ type of a dtype summed natively (no widening); false for the
// others (f16, bf16: through f32) and for unknown values.
template <typename F>
bool visit_native(DType t, F&& go) {
  switch (t) {
    case DType::f32: go(static_cast<float*>(nullptr)); return true;
    case DType::f64: go(static_cast<double*>(nullptr)); return true;
    case DType::i32: go(static_cast<int32_t*>(nullptr)); return true;
    case DType::i64: go(static_cast<int64_t*>(nullptr)); return true;
    default: return false;
  }
}

// op: 0 widen, 1 add2, 2 add, 3 narrow.
void dispatch(int op, DType t, void* acc, const void* a, const void* b, void* out, size_t n) {
  const bool avx = cpu_has_avx2();
  if (t == DType::f16 || t == DType::bf16) {
    auto* f = static_cast<float*>(acc);
    auto* ha = static_cast<const uint16_t*>(a);
    auto* hb = static_cast<const uint16_t*>(b);
    auto* ho = static_cast<uint16_t*>(out);
    if (t == DType::f16) avx ? half_op_avx2<true>(op, f, ha, hb, ho, n) : half_op_scalar<true>(op, f, ha, hb, ho, n);
    else avx ? half_op_avx2<false>(op, f, ha, hb, ho, n) : half_op_scalar<false>(op, f, ha, hb, ho, n);
    return;
  }
  auto go = [&]<typename T>(T*) {
    auto* x = static_cast<T*>(acc);
    auto* y = static_cast<const T*>(a);
    auto* z = static_cast<const T*>(b);
    avx ? same_op_avx2<T>(op, x, y, z, n) : same_op_scalar<T>(op, x, y, z, n);
  };
  visit_native(t, go);
}

}  // namespace

void widen(DType t, void* acc, const void* a, size_t n) {
  if (needs_narrowing(t)) dispatch(0, t, acc, a, nullptr, nullptr, n);
  else if (acc != a) std::memcpy(acc, a, n * dtype_size(t));
}
void add2(DType t, void* acc, const void* a, const void* b, size_t n) { dispatch(1, t, acc, a, b, nullptr, n); }
void add(DType t, void* acc, const void* b, size_t n) { dispatch(2, t, acc, nullptr, b, nullptr, n); }
void narrow(DType t, void* out, const void* acc, size_t n) {
  if (needs_narrowing(t)) dispatch(3, t, const_cast<void*>(acc), nullptr, nullptr, out, n);
  else if (out != acc) std::memcpy(out, acc, n * dtype_size(t));
}

void sum_ranked(DType t, void* out, std::span<const void* const> srcs, size_t n) {
  // Blocked so the running sum stays in L1; per element the order is always s[0] + s[1] + s[2] + ...
  constexpr size_t kBlock = 2048;
  alignas(64) float scratch[kBlock];
  const size_t es = dtype_size(t);
  const bool half = needs_narrowing(t);
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = std::min(kBlock, n - at);
    auto src = [&](size_t r) { return static_cast<const std::byte*>(srcs[r]) + at * es; };
    void* o = static_cast<std::byte*>(out) + at * es;
    void* acc = half ? static_cast<void*>(scratch) : o;
    if (srcs.size() == 1) widen(t, acc, src(0), m);
    else add2(t, acc, src(0), src(1), m);
    for (size_t r = 2; r < srcs.size(); ++r) add(t, acc, src(r), m);
    if (half) narrow(t, o, acc, m);
  }
}

namespace {
// The same-type pairwise sum without __restrict: out aliases a for in-place reductions.
template <typename T>
CS_AVX2 void pair_same_avx2(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
template <typename T>
void pair_same_scalar(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
}  // namespace

void sum_pair(DType t, void* out, const void* a, const void* b, size_t n) {
  if (needs_narrowing(t)) {
    // Blocked through an f32 scratch that stays in L1; each block reads a and b before it writes out, so out may
    // alias either. One rounding per element, as in the accumulator kernels.
    constexpr size_t kBlock = 2048;
    alignas(64) float scratch[kBlock];
    for (size_t at = 0; at < n; at += kBlock) {
      const size_t m = std::min(kBlock, n - at);
      add2(t, scratch, static_cast<const uint16_t*>(a) + at, static_cast<const uint16_t*>(b) + at, m);
      narrow(t, static_cast<uint16_t*>(out) + at, scratch, m);
    }
    return;
  }
  const bool avx = cpu_has_avx2();
  auto go = [&]<typename T>(T*) {
    auto* o = static_cast<T*>(out);
    auto* x = static_cast<const T*>(a);
    auto* y = static_cast<const T*>(b);
    avx ? pair_same_avx2<T>(o, x, y, n) : pair_same_scalar<T>(o, x, y, n);
  };
  if (visit_native(t, go)) return;
  throw InvalidArgument("sum_pair: unknown dtype value " + std::to_string(static_cast<int>(t)));
}

}  // namespace kernels

void sum_into(DType dtype, void* dst, const void* src, size_t count) { kernels::sum_pair(dtype, dst, dst, src, count); }

}  // namespace commsched
