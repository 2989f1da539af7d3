#include "compression/codec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <vector>

#include "comm_backends/half.h"

namespace commsched::compression {
namespace {

// Element access by dtype, widened to the accumulation type A (double for f64, float otherwise).
struct F32 {
  using Store = float;
  using Acc = float;
  static Acc load(Store v) { return v; }
  static Store store(Acc v) { return v; }
};
struct F64 {
  using Store = double;
  using Acc = double;
  static Acc load(Store v) { return v; }
  static Store store(Acc v) { return v; }
};
struct F16 {
  using Store = uint16_t;
  using Acc = float;
  static Acc load(Store v) { return f16_to_f32(v); }
  static Store store(Acc v) { return f32_to_f16(v); }
};
struct BF16 {
  using Store = uint16_t;
  using Acc = float;
  static Acc load(Store v) { return bf16_to_f32(v); }
  static Store store(Acc v) { return f32_to_bf16(v); }
};

template <class Fn>
void with_type(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(F32{});
    case DType::f64: return fn(F64{});
    case DType::f16: return fn(F16{});
    case DType::bf16: return fn(BF16{});
    default: throw InvalidArgument("compression: dtype " + std::to_string(static_cast<int>(d)) + " is not a floating type");
  }
}

size_t elem_size(DType d) { return d == DType::f64 ? 8 : (d == DType::f32 ? 4 : 2); }

// The gradient plus the residual, in the accumulation type; the residual (if any) is not modified here.
template <class T>
std::vector<typename T::Acc> accumulated(const void* in, uint64_t n, const void* residual) {
  std::vector<typename T::Acc> acc(n);
  const auto* x = static_cast<const typename T::Store*>(in);
  const auto* r = static_cast<const typename T::Acc*>(residual);
  for (uint64_t i = 0; i < n; ++i) acc[i] = r ? T::load(x[i]) + r[i] : T::load(x[i]);
  return acc;
}

// The same from values already in the accumulation type (a parameter server's sum).
template <class T>
std::vector<typename T::Acc> accumulated_sum(const void* in, uint64_t n, const void* residual) {
  const auto* x = static_cast<const typename T::Acc*>(in);
  std::vector<typename T::Acc> acc(x, x + n);
  if (const auto* r = static_cast<const typename T::Acc*>(residual))
    for (uint64_t i = 0; i < n; ++i) acc[i] += r[i];
  return acc;
}

template <class T>
void topk_encode(std::vector<typename T::Acc> acc, void* residual, double ratio, std::byte* out) {
  using A = typename T::Acc;
  using S = typename T::Store;
  const uint64_t n = acc.size();
  const uint64_t k = topk_count(ratio, n);
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  // Ties broken by index so the choice is deterministic on every worker and every run.
  auto larger = [&](uint32_t a, uint32_t b) {
    const A ma = std::abs(acc[a]), mb = std::abs(acc[b]);
    return ma > mb || (ma == mb && a < b);
  };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), larger);
  std::sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k));  // ascending indices: cache-friendly decode
  auto* oi = reinterpret_cast<uint32_t*>(out);
  auto* ov = reinterpret_cast<S*>(out + k * sizeof(uint32_t));
  auto* r = static_cast<A*>(residual);
  for (uint64_t j = 0; j < k; ++j) {
    const uint32_t i = idx[j];
    const S sent = T::store(acc[i]);
    std::memcpy(oi + j, &i, sizeof i);
    std::memcpy(ov + j, &sent, sizeof sent);
    if (r) acc[i] -= T::load(sent);  // what the cast lost stays behind too
  }
  if (r) std::copy(acc.begin(), acc.end(), r);  // sent elements keep only their rounding, the others all of acc
}

// Calls fn(index, value) for each pair of a top-k message of n elements.
template <class T, class Fn>
void topk_each(const std::byte* wire, uint64_t n, double ratio, Fn&& fn) {
  const uint64_t k = topk_count(ratio, n);
  for (uint64_t j = 0; j < k; ++j) {
    uint32_t i;
    typename T::Store v;
    std::memcpy(&i, wire + j * sizeof(uint32_t), sizeof i);
    std::memcpy(&v, wire + k * sizeof(uint32_t) + j * sizeof v, sizeof v);
    if (i >= n) throw InvalidArgument("top-k message names element " + std::to_string(i) + " of " + std::to_string(n));
    fn(i, T::load(v));
  }
}

uint64_t sign_words(uint64_t n) { return (n + 31) / 32; }

template <class T>
void sign_encode(std::vector<typename T::Acc> acc, void* residual, std::byte* out) {
  using A = typename T::Acc;
  const uint64_t n = acc.size();
  double l1 = 0;
  for (A v : acc) l1 += std::abs(static_cast<double>(v));
  const float scale = n ? static_cast<float>(l1 / static_cast<double>(n)) : 0.0f;
  std::memcpy(out, &scale, sizeof scale);
  std::vector<uint32_t> words(sign_words(n), 0);
  for (uint64_t i = 0; i < n; ++i)
    if (acc[i] >= 0) words[i / 32] |= 1u << (i % 32);
  if (!words.empty()) std::memcpy(out + sizeof scale, words.data(), words.size() * sizeof(uint32_t));
  if (auto* r = static_cast<A*>(residual)) {
    // The value the receiver reconstructs, rounded to the dtype as decode() stores it.
    const A plus = T::load(T::store(static_cast<A>(scale)));
    for (uint64_t i = 0; i < n; ++i) r[i] = acc[i] - (acc[i] >= 0 ? plus : -plus);
  }
}

template <class T, class Fn>
void sign_each(const std::byte* wire, uint64_t n, Fn&& fn) {
  using A = typename T::Acc;
  float scale;
  std::memcpy(&scale, wire, sizeof scale);
  const A plus = T::load(T::store(static_cast<A>(scale)));
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, wire + sizeof scale + (i / 32) * sizeof(uint32_t), sizeof w);
    fn(i, (w >> (i % 32)) & 1u ? plus : -plus);
  }
}

template <class From, class To>
void cast(const void* in, void* out, uint64_t n) {
  const auto* x = static_cast<const typename From::Store*>(in);
  auto* y = static_cast<typename To::Store*>(out);
  for (uint64_t i = 0; i < n; ++i) y[i] = To::store(static_cast<typename To::Acc>(From::load(x[i])));
}

DType cast_target(Scheme s) { return s == Scheme::fp16 ? DType::f16 : DType::bf16; }

template <class T>
void cast_between(DType from_or_to, bool encode_dir, const void* in, void* out, uint64_t n) {
  // T is the task's dtype; from_or_to the wire's.
  if (from_or_to == DType::f16) encode_dir ? cast<T, F16>(in, out, n) : cast<F16, T>(in, out, n);
  else encode_dir ? cast<T, BF16>(in, out, n) : cast<BF16, T>(in, out, n);
}

}  // namespace

std::string_view scheme_name(Scheme s) {
  switch (s) {
    case Scheme::none: return "none";
    case Scheme::fp16: return "fp16";
    case Scheme::bf16: return "bf16";
    case Scheme::topk: return "topk";
    case Scheme::signsgd: return "signsgd";
  }
  return "invalid";
}

Spec parse_spec(std::string_view var, std::string_view value) {
  std::string v;
  for (char c : value)
    if (!std::isspace(static_cast<unsigned char>(c))) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string allowed = "one of none, fp16, bf16, topk, topk:RATIO (RATIO in (0, 1], e.g. topk:0.01), signsgd";
  auto reject = [&] { throw InvalidArgument(std::string(var) + "='" + std::string(value) + "' is invalid: " + allowed); };
  Spec s;
  if (v == "none" || v == "off" || v.empty()) return s;
  if (v == "fp16" || v == "float16" || v == "half") s.scheme = Scheme::fp16;
  else if (v == "bf16" || v == "bfloat16") s.scheme = Scheme::bf16;
  else if (v == "signsgd" || v == "sign" || v == "1bit") s.scheme = Scheme::signsgd;
  else if (v.rfind("topk", 0) == 0) {
    s.scheme = Scheme::topk;
    if (v.size() > 4) {
      if (v[4] != ':') reject();
      const std::string num = v.substr(5);
      char* end = nullptr;
      s.ratio = std::strtod(num.c_str(), &end);
      if (num.empty() || end != num.c_str() + num.size() || !(s.ratio > 0 && s.ratio <= 1)) reject();
    }
  } else reject();
  return s;
}

std::string to_string(const Spec& s) {
  if (s.scheme != Scheme::topk) return std::string(scheme_name(s.scheme));
  std::ostringstream os;
  os << "topk:" << s.ratio;
  return os.str();
}

bool compressible(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16; }
DType residual_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

uint64_t topk_count(double ratio, uint64_t n) {
  if (n == 0) return 0;
  const auto k = static_cast<uint64_t>(std::ceil(ratio * static_cast<double>(n) - 1e-9));
  return std::clamp<uint64_t>(k, 1, n);
}

uint64_t encoded_bytes(const Spec& s, DType d, uint64_t n) {
  switch (s.scheme) {
    case Scheme::none: return n * elem_size(d);
    case Scheme::fp16:
    case Scheme::bf16: return n * 2;
    case Scheme::topk: return topk_count(s.ratio, n) * (sizeof(uint32_t) + elem_size(d));
    case Scheme::signsgd: return sizeof(float) + sign_words(n) * sizeof(uint32_t);
  }
  return 0;
}

void encode(const Spec& s, DType d, const void* in, uint64_t n, void* residual, std::byte* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    switch (s.scheme) {
      case Scheme::none: std::memcpy(out, in, n * sizeof(typename T::Store)); break;
      case Scheme::fp16:
      case Scheme::bf16: cast_between<T>(cast_target(s.scheme), true, in, out, n); break;
      case Scheme::topk: topk_encode<T>(accumulated<T>(in, n, residual), residual, s.ratio, out); break;
      case Scheme::signsgd: sign_encode<T>(accumulated<T>(in, n, residual), residual, out); break;
    }
  });
}

void encode_sum(const Spec& s, DType d, const void* acc, uint64_t n, void* residual, std::byte* out) {
  if (sums_on_wire(s.scheme) || s.scheme == Scheme::none)
    throw InvalidArgument("compression: encode_sum is for schemes a reduction decodes (topk, signsgd), not '" +
                          std::string(scheme_name(s.scheme)) + "'");
  with_type(d, [&](auto t) {
    using T = decltype(t);
    if (s.scheme == Scheme::topk) topk_encode<T>(accumulated_sum<T>(acc, n, residual), residual, s.ratio, out);
    else sign_encode<T>(accumulated_sum<T>(acc, n, residual), residual, out);
  });
}

std::string wire_spec(Scheme scheme, DType d, uint64_t n, uint64_t wire_bytes, Spec& out) {
  const std::string what = std::string(scheme_name(scheme)) + " message of " + std::to_string(wire_bytes) +
                           " bytes for " + std::to_string(n) + " elements";
  if (scheme != Scheme::topk && scheme != Scheme::signsgd) return "scheme '" + std::string(scheme_name(scheme)) +
                                                                   "' is not decoded by a reduction";
  if (!compressible(d)) return std::string(scheme_name(scheme)) + " of a tensor that is not floating-point";
  out = Spec{scheme, 1.0};
  if (scheme == Scheme::signsgd)
    return wire_bytes == encoded_bytes(out, d, n) ? std::string() : what + " (expected " +
                                                                        std::to_string(encoded_bytes(out, d, n)) + ")";
  const uint64_t pair = sizeof(uint32_t) + elem_size(d);
  const uint64_t k = wire_bytes / pair;
  if (wire_bytes % pair != 0 || k == 0 || k > n) return what + " (not 1 to n index/value pairs)";
  // The ratio whose topk_count is exactly k (k/n itself, nudged where rounding would miss).
  double ratio = static_cast<double>(k) / static_cast<double>(n);
  while (topk_count(ratio, n) > k) ratio = std::nextafter(ratio, 0.0);
  while (topk_count(ratio, n) < k) ratio = std::nextafter(ratio, 2.0);
  out.ratio = ratio;
  return {};
}

void decode(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    auto* y = static_cast<typename T::Store*>(out);
    switch (s.scheme) {
      case Scheme::none: std::memcpy(out, wire, n * sizeof(typename T::Store)); break;
      case Scheme::fp16:
      case Scheme::bf16: cast_between<T>(cast_target(s.scheme), false, wire, out, n); break;
      case Scheme::topk:
        std::fill(y, y + n, T::store(0));
        topk_each<T>(wire, n, s.ratio, [&](uint32_t i, auto v) { y[i] = T::store(v); });
        break;
      case Scheme::signsgd: sign_each<T>(wire, n, [&](uint64_t i, auto v) { y[i] = T::store(v); }); break;
    }
  });
}

void decode_add(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* acc) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    auto* a = static_cast<typename T::Acc*>(acc);
    switch (s.scheme) {
      case Scheme::topk: topk_each<T>(wire, n, s.ratio, [&](uint32_t i, auto v) { a[i] += v; }); break;
      case Scheme::signsgd: sign_each<T>(wire, n, [&](uint64_t i, auto v) { a[i] += v; }); break;
      default: {
        std::vector<typename T::Store> tmp(n);
        decode(s, d, wire, n, tmp.data());
        for (uint64_t i = 0; i < n; ++i) a[i] += T::load(tmp[i]);
      }
    }
  });
}

}  // namespace commsched::compression
