// The one implementation of 16-bit float conversions (IEEE half and bfloat16, round to nearest even, NaN stays NaN),
// shared by the loopback reduction, the parameter server's kernels, the Gloo backend and the tests. Inline, so the
// scalar loops that call them per element can be vectorised and need no call.
#pragma once

#include <bit>
#include <cstdint>

namespace commsched {

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);               // inf / nan
  else if (exp != 0) bits = sign | ((exp + 112) << 23) | (man << 13);     // normal
  else if (man == 0) bits = sign;                                         // zero
  else {                                                                  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do { ++e; m <<= 1; } while (!(m & 0x400u));
    bits = sign | ((112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);    // rounds to inf
  if (ax < 0x38800000u) {                                                 // subnormal or zero in f16
    const float r = std::bit_cast<float>(ax) + 0.5f;                      // the FPU rounds to nearest even for us
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  const uint32_t odd = (ax >> 13) & 1u;
  return static_cast<uint16_t>(sign | ((ax + 0xc8000fffu + odd) >> 13));  // rebias exponent, round to nearest even
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // keep NaN quiet
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace commsched
