// IEEE fp16 and bfloat16 <-> fp32 conversions (bit-exact, round-to-nearest-even), host side.
#pragma once
#include <cstdint>
#include <cstring>

namespace bonsai {

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {
    if (man == 0) return bits_to_f32(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t f32_to_fp16(float f) {
  const uint32_t x = f32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));  // inf / nan
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: overflow to inf
  if (ax < 0x38800000u) {  // below the smallest normal 2^-14: subnormal or zero
    if (ax < 0x33000000u) return uint16_t(sign);  // < 2^-25 rounds to zero
    const uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (127 - e) - 1 ... result = m >> (shift) with rne
    const uint32_t res = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    uint32_t r = res + (rem > half || (rem == half && (res & 1)));
    return uint16_t(sign | r);
  }
  uint32_t r = ax - 0x38000000u;  // rebias 127 -> 15
  r = (r + 0xfff + ((r >> 13) & 1)) >> 13;  // round to nearest even
  return uint16_t(sign | r);
}

inline float bf16_to_f32(uint16_t b) { return bits_to_f32(uint32_t(b) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet nan
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

}  // namespace bonsai
