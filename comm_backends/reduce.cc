#include "comm_backends/reduce.h"

#include <cstring>

namespace commsched {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0);  // inf / nan
  if (absx >= 0x477ff000u) return sign | 0x7c00;                                     // overflow → inf
  if (absx < 0x38800000u) {                                                          // subnormal or zero in f16
    if (absx < 0x33000000u) return sign;
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // value = m * 2^(e-150); f16 subnormal mantissa = value / 2^-24 = m >> shift
    uint32_t half = m >> shift;
    const bool round_bit = (m >> (shift - 1)) & 1;
    const bool sticky = (m & ((1u << (shift - 1)) - 1)) != 0;
    if (round_bit && (sticky || (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 → 15
  const uint32_t mant_low = r & 0x1fff;
  r >>= 13;
  if (mant_low > 0x1000 || (mant_low == 0x1000 && (r & 1))) ++r;
  return sign | static_cast<uint16_t>(r);
}

float bf16_to_f32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // keep NaN a NaN
  const uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

namespace {
template <typename T>
void add(void* dst, const void* src, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void add16(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = FromF(ToF(d[i]) + ToF(s[i]));
}
}  // namespace

void sum_into(DType dtype, void* dst, const void* src, size_t count) {
  switch (dtype) {
    case DType::f32: add<float>(dst, src, count); return;
    case DType::f64: add<double>(dst, src, count); return;
    case DType::i32: add<int32_t>(dst, src, count); return;
    case DType::i64: add<int64_t>(dst, src, count); return;
    case DType::f16: add16<f16_to_f32, f32_to_f16>(dst, src, count); return;
    case DType::bf16: add16<bf16_to_f32, f32_to_bf16>(dst, src, count); return;
  }
  throw InvalidArgument("sum_into: unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace commsched
