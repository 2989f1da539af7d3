#include "compression/codec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <vector>

#include "base/half.h"

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

template <class T>
void cast_between(DType from_or_to, bool encode_dir, const void* in, void* out, uint64_t n) {
  // T is the task's dtype; from_or_to the wire's.
  if (from_or_to == DType::f16) encode_dir ? cast<T, F16>(in, out, n) : cast<F16, T>(in, out, n);
  else encode_dir ? cast<T, BF16>(in, out, n) : cast<BF16, T>(in, out, n);
}

// Each codec's own code, with a row below.

uint64_t dense_bytes(const Spec&, DType d, uint64_t n) { return n * elem_size(d); }
void dense_encode(const Spec&, DType d, const void* in, uint64_t n, void*, std::byte* out) {
  with_type(d, [&](auto t) { std::memcpy(out, in, n * sizeof(typename decltype(t)::Store)); });
}
void dense_decode(const Spec&, DType d, const std::byte* wire, uint64_t n, void* out) {
  with_type(d, [&](auto t) { std::memcpy(out, wire, n * sizeof(typename decltype(t)::Store)); });
}

uint64_t cast_bytes(const Spec&, DType, uint64_t n) { return n * 2; }
template <DType Wire>
void cast_encode(const Spec&, DType d, const void* in, uint64_t n, void*, std::byte* out) {
  with_type(d, [&](auto t) { cast_between<decltype(t)>(Wire, true, in, out, n); });
}
template <DType Wire>
void cast_decode(const Spec&, DType d, const std::byte* wire, uint64_t n, void* out) {
  with_type(d, [&](auto t) { cast_between<decltype(t)>(Wire, false, wire, out, n); });
}

uint64_t topk_bytes(const Spec& s, DType d, uint64_t n) { return topk_count(s.ratio, n) * (sizeof(uint32_t) + elem_size(d)); }
void topk_encode_fn(const Spec& s, DType d, const void* in, uint64_t n, void* residual, std::byte* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    topk_encode<T>(accumulated<T>(in, n, residual), residual, s.ratio, out);
  });
}
void topk_encode_sum(const Spec& s, DType d, const void* acc, uint64_t n, void* residual, std::byte* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    topk_encode<T>(accumulated_sum<T>(acc, n, residual), residual, s.ratio, out);
  });
}
void topk_decode(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    auto* y = static_cast<typename T::Store*>(out);
    std::fill(y, y + n, T::store(0));
    topk_each<T>(wire, n, s.ratio, [&](uint32_t i, auto v) { y[i] = T::store(v); });
  });
}
void topk_decode_add(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* acc) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    auto* a = static_cast<typename T::Acc*>(acc);
    topk_each<T>(wire, n, s.ratio, [&](uint32_t i, auto v) { a[i] += v; });
  });
}
std::string topk_size_spec(DType d, uint64_t n, uint64_t wire_bytes, Spec& out) {
  const uint64_t pair = sizeof(uint32_t) + elem_size(d);
  const uint64_t k = wire_bytes / pair;
  if (wire_bytes % pair != 0 || k == 0 || k > n) return " (not 1 to n index/value pairs)";
  // The ratio whose topk_count is exactly k (k/n itself, nudged where rounding would miss).
  double ratio = static_cast<double>(k) / static_cast<double>(n);
  while (topk_count(ratio, n) > k) ratio = std::nextafter(ratio, 0.0);
  while (topk_count(ratio, n) < k) ratio = std::nextafter(ratio, 2.0);
  out.ratio = ratio;
  return {};
}

uint64_t sign_bytes(const Spec&, DType, uint64_t n) { return sizeof(float) + sign_words(n) * sizeof(uint32_t); }
void sign_encode_fn(const Spec&, DType d, const void* in, uint64_t n, void* residual, std::byte* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    sign_encode<T>(accumulated<T>(in, n, residual), residual, out);
  });
}
void sign_encode_sum(const Spec&, DType d, const void* acc, uint64_t n, void* residual, std::byte* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    sign_encode<T>(accumulated_sum<T>(acc, n, residual), residual, out);
  });
}
void sign_decode(const Spec&, DType d, const std::byte* wire, uint64_t n, void* out) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    auto* y = static_cast<typename T::Store*>(out);
    sign_each<T>(wire, n, [&](uint64_t i, auto v) { y[i] = T::store(v); });
  });
}
void sign_decode_add(const Spec&, DType d, const std::byte* wire, uint64_t n, void* acc) {
  with_type(d, [&](auto t) {
    using T = decltype(t);
    auto* a = static_cast<typename T::Acc*>(acc);
    sign_each<T>(wire, n, [&](uint64_t i, auto v) { a[i] += v; });
  });
}
std::string sign_size_spec(DType d, uint64_t n, uint64_t wire_bytes, Spec& out) {
  const uint64_t expected = sign_bytes(out, d, n);
  return wire_bytes == expected ? std::string() : " (expected " + std::to_string(expected) + ")";
}

constexpr double us = 1e-6;
constexpr std::string_view kNoneAliases[] = {"off"};
constexpr std::string_view kFp16Aliases[] = {"float16", "half"};
constexpr std::string_view kBf16Aliases[] = {"bfloat16"};
constexpr std::string_view kSignAliases[] = {"sign", "1bit"};

// The registry. Stage costs: stage_micro_bench on one 4 MiB f32 partition on one core, encode with error feedback
// (bench/RESULTS.md, "Compression stage cost per MiB").
const Codec kCodecs[] = {
    {.scheme = Scheme::none, .name = "none", .aliases = kNoneAliases, .summing = Summing::dense,
     .wire_bytes = dense_bytes, .encode = dense_encode, .decode = dense_decode},
    {.scheme = Scheme::fp16, .name = "fp16", .aliases = kFp16Aliases, .summing = Summing::on_wire,
     .wire_dtype = DType::f16, .wire_bytes = cast_bytes, .encode = cast_encode<DType::f16>,
     .decode = cast_decode<DType::f16>, .encode_s_per_mib = 370 * us, .decode_s_per_mib = 413 * us},
    {.scheme = Scheme::bf16, .name = "bf16", .aliases = kBf16Aliases, .summing = Summing::on_wire,
     .wire_dtype = DType::bf16, .wire_bytes = cast_bytes, .encode = cast_encode<DType::bf16>,
     .decode = cast_decode<DType::bf16>, .encode_s_per_mib = 230 * us, .decode_s_per_mib = 104 * us},
    // Error feedback on the server for top-k only: what its answer leaves out is sent in a later round, exactly.
    {.scheme = Scheme::topk, .name = "topk", .takes_ratio = true, .summing = Summing::server_decodes,
     .server_residual = true, .wire_bytes = topk_bytes, .encode = topk_encode_fn, .decode = topk_decode,
     .decode_add = topk_decode_add, .encode_sum = topk_encode_sum, .size_spec = topk_size_spec,
     .encode_s_per_mib = 3927 * us, .decode_s_per_mib = 15 * us},
    // signSGD's server answers with the plain scaled sign of the sum (majority vote, as signSGD-MV does): the workers
    // keep their own residuals, and a second one on the server made the small CNN diverge at 2 workers in our runs.
    {.scheme = Scheme::signsgd, .name = "signsgd", .aliases = kSignAliases, .summing = Summing::server_decodes,
     .wire_bytes = sign_bytes, .encode = sign_encode_fn, .decode = sign_decode, .decode_add = sign_decode_add,
     .encode_sum = sign_encode_sum, .size_spec = sign_size_spec, .encode_s_per_mib = 2420 * us,
     .decode_s_per_mib = 1566 * us},
};

std::string lower_no_space(std::string_view value) {
  std::string v;
  for (char c : value)
    if (!std::isspace(static_cast<unsigned char>(c))) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v;
}

bool answers_to(const Codec& c, std::string_view v) {
  return c.name == v || std::find(c.aliases.begin(), c.aliases.end(), v) != c.aliases.end();
}

}  // namespace

std::span<const Codec> codecs() { return kCodecs; }

std::string codec_row_gap(const Codec& c) {
  const std::string who = "codec '" + std::string(c.name) + "' ";
  if (c.name.empty()) return "a codec row has no name";
  if (!c.wire_bytes || !c.encode || !c.decode) return who + "lacks wire_bytes, encode or decode";
  const bool decodes = c.summing == Summing::server_decodes;
  if (decodes != (c.decode_add && c.encode_sum && c.size_spec))
    return who + "must have decode_add, encode_sum and size_spec exactly when a server decodes it";
  if (c.server_residual && !decodes) return who + "keeps a server residual but no server decodes it";
  if (c.summing == Summing::on_wire && !compressible(c.wire_dtype))
    return who + "is summed on the wire but its wire dtype is not floating-point";
  if (c.summing != Summing::dense && !(c.encode_s_per_mib > 0 && c.decode_s_per_mib > 0))
    return who + "has no measured stage costs for the simulator";
  return "";
}

const Codec& codec(Scheme s) {
  for (const Codec& c : kCodecs)
    if (c.scheme == s) return c;
  throw InvalidArgument("compression: scheme " + std::to_string(static_cast<int>(s)) + " is not registered");
}

bool is_registered(uint8_t v) {
  return std::any_of(std::begin(kCodecs), std::end(kCodecs), [&](const Codec& c) { return uint8_t(c.scheme) == v; });
}

std::string_view scheme_name(Scheme s) { return is_registered(uint8_t(s)) ? codec(s).name : "invalid"; }

std::string specs_allowed() {
  std::string out;
  for (const Codec& c : kCodecs) {
    out += (out.empty() ? "one of " : ", ") + std::string(c.name);
    if (c.takes_ratio) out += ", " + std::string(c.name) + ":RATIO (RATIO in (0, 1], e.g. " + std::string(c.name) + ":0.01)";
  }
  return out;
}

Spec parse_spec(std::string_view var, std::string_view value) {
  const std::string v = lower_no_space(value);
  auto reject = [&] {
    throw InvalidArgument(std::string(var) + "='" + std::string(value) + "' is invalid: " + specs_allowed());
  };
  if (v.empty()) return Spec{};
  for (const Codec& c : kCodecs) {
    const std::string_view head = std::string_view(v).substr(0, v.find(':'));
    if (!answers_to(c, head)) continue;
    Spec s{c.scheme};
    if (head.size() == v.size()) return s;
    if (!c.takes_ratio) reject();
    const std::string num = v.substr(head.size() + 1);
    char* end = nullptr;
    s.ratio = std::strtod(num.c_str(), &end);
    if (num.empty() || end != num.c_str() + num.size() || !(s.ratio > 0 && s.ratio <= 1)) reject();
    return s;
  }
  reject();
  return Spec{};
}

std::string to_string(const Spec& s) {
  if (!codec(s.scheme).takes_ratio) return std::string(scheme_name(s.scheme));
  std::ostringstream os;
  os << scheme_name(s.scheme) << ":" << s.ratio;
  return os.str();
}

bool compressible(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16; }
DType residual_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

uint64_t topk_count(double ratio, uint64_t n) {
  if (n == 0) return 0;
  const auto k = static_cast<uint64_t>(std::ceil(ratio * static_cast<double>(n) - 1e-9));
  return std::clamp<uint64_t>(k, 1, n);
}

uint64_t encoded_bytes(const Spec& s, DType d, uint64_t n) { return codec(s.scheme).wire_bytes(s, d, n); }

void encode(const Spec& s, DType d, const void* in, uint64_t n, void* residual, std::byte* out) {
  codec(s.scheme).encode(s, d, in, n, residual, out);
}

void encode_sum(const Spec& s, DType d, const void* acc, uint64_t n, void* residual, std::byte* out) {
  const Codec& c = codec(s.scheme);
  if (c.encode_sum == nullptr)
    throw InvalidArgument("compression: encode_sum is for schemes a reduction decodes, not '" + std::string(c.name) + "'");
  c.encode_sum(s, d, acc, n, residual, out);
}

std::string wire_spec(Scheme scheme, DType d, uint64_t n, uint64_t wire_bytes, Spec& out) {
  if (!is_registered(uint8_t(scheme)) || codec(scheme).size_spec == nullptr)
    return "scheme '" + std::string(scheme_name(scheme)) + "' is not decoded by a reduction";
  if (!compressible(d)) return std::string(scheme_name(scheme)) + " of a tensor that is not floating-point";
  out = Spec{scheme, 1.0};
  const std::string why = codec(scheme).size_spec(d, n, wire_bytes, out);
  if (why.empty()) return {};
  return std::string(scheme_name(scheme)) + " message of " + std::to_string(wire_bytes) + " bytes for " +
         std::to_string(n) + " elements" + why;
}

void decode(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* out) {
  codec(s.scheme).decode(s, d, wire, n, out);
}

void decode_add(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* acc) {
  const Codec& c = codec(s.scheme);
  if (c.decode_add != nullptr) return c.decode_add(s, d, wire, n, acc);
  with_type(d, [&](auto t) {  // a codec the reduction does not decode natively: decode, then add
    using T = decltype(t);
    auto* a = static_cast<typename T::Acc*>(acc);
    std::vector<typename T::Store> tmp(n);
    c.decode(s, d, wire, n, tmp.data());
    for (uint64_t i = 0; i < n; ++i) a[i] += T::load(tmp[i]);
  });
}

}  // namespace commsched::compression
