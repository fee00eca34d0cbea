// Ternary block codecs: PQ2_0, PTQ1_0, MLX affine 2-bit <-> canonical words + fp16 scales.
// The layouts are documented in ternary_codec.h and FACTS.md section 4.
#include "format/ternary_codec.h"

#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace bonsai {
namespace {

constexpr int kWordsPerGroup = kTernaryGroup / kCodesPerWord;  // 8

inline uint16_t load_u16le(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }
inline void store_u16le(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v & 0xff);
  p[1] = uint8_t(v >> 8);
}
inline uint32_t load_u32le(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline void store_u32le(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v >> 16);
  p[3] = uint8_t(v >> 24);
}

// Trit n (n = 0 most significant) of a base-3 byte: the byte approximates 256 * frac, frac in [0, 1)
// with frac = 0.t0 t1 t2 t3 t4 (base 3); multiplying by 3^n (mod 256) drops the first n digits and
// (x * 3) >> 8 reads the next one.
constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
inline int trit_of(uint8_t b, int n) { return (int(uint8_t(b * kPow3[n])) * 3) >> 8; }

// Encode up to 5 trits (first most significant) scaled so that they fill the 5-digit fraction.
// `v` is sum(trit_n * 3^(4-n)) in [0, 242]; the ceil makes the decode's truncation land inside the digit.
inline uint8_t trit_byte(int v) { return uint8_t((v * 256 + 242) / 243); }

// Position maps of PTQ1_0 (see header): element index for (byte, trit).
inline int ptq1_elem_qs(int byte, int t) { return byte < 16 ? byte + 16 * t : 80 + (byte - 16) + 8 * t; }
inline int ptq1_elem_qh(int h, int t) { return 120 + h + 2 * t; }

inline int code_at(const uint32_t* words, int e) { return int((words[e >> 4] >> (2 * (e & 15))) & 3u); }

}  // namespace

void pq2_decode_block(const uint8_t* block, uint32_t* words, uint16_t* d) {
  *d = load_u16le(block);
  // qs bytes 4i..4i+3 as a little-endian u32 are word i (element j at byte j/4, bits 2*(j%4)).
  for (int i = 0; i < kWordsPerGroup; ++i) words[i] = load_u32le(block + 2 + 4 * i);
}

void pq2_encode_block(const uint32_t* words, uint16_t d, uint8_t* block) {
  store_u16le(block, d);
  for (int i = 0; i < kWordsPerGroup; ++i) store_u32le(block + 2 + 4 * i, words[i]);
}

void ptq1_decode_block(const uint8_t* block, uint32_t* words, uint16_t* d) {
  for (int i = 0; i < kWordsPerGroup; ++i) words[i] = 0;
  auto put = [&](int e, int q) { words[e >> 4] |= uint32_t(q) << (2 * (e & 15)); };
  for (int b = 0; b < 24; ++b)
    for (int t = 0; t < 5; ++t) put(ptq1_elem_qs(b, t), trit_of(block[b], t));
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 4; ++t) put(ptq1_elem_qh(h, t), trit_of(block[24 + h], t));
  *d = load_u16le(block + 26);
}

bool ptq1_encode_block(const uint32_t* words, uint16_t d, uint8_t* block) {
  for (int e = 0; e < kTernaryGroup; ++e)
    if (code_at(words, e) == 3) return false;
  for (int b = 0; b < 24; ++b) {
    int v = 0;
    for (int t = 0; t < 5; ++t) v = v * 3 + code_at(words, ptq1_elem_qs(b, t));
    block[b] = trit_byte(v);
  }
  for (int h = 0; h < 2; ++h) {
    int v = 0;
    for (int t = 0; t < 4; ++t) v = v * 3 + code_at(words, ptq1_elem_qh(h, t));
    block[24 + h] = trit_byte(v * 3);  // 4 trits fill digits 0..3; digit 4 is zero
  }
  store_u16le(block + 26, d);
  return true;
}

void pq2_to_canonical(const uint8_t* src, uint64_t N, uint64_t K, uint32_t* words, uint16_t* scales) {
  if (K % kTernaryGroup) fail("pq2_to_canonical: K = {} is not a multiple of {}", K, kTernaryGroup);
  const uint64_t groups = N * (K / kTernaryGroup);
  for (uint64_t g = 0; g < groups; ++g)
    pq2_decode_block(src + g * kPq2Bytes, words + g * kWordsPerGroup, scales + g);
}

void canonical_to_pq2(const uint32_t* words, const uint16_t* scales, uint64_t N, uint64_t K, uint8_t* dst) {
  if (K % kTernaryGroup) fail("canonical_to_pq2: K = {} is not a multiple of {}", K, kTernaryGroup);
  const uint64_t groups = N * (K / kTernaryGroup);
  for (uint64_t g = 0; g < groups; ++g)
    pq2_encode_block(words + g * kWordsPerGroup, scales[g], dst + g * kPq2Bytes);
}

void ptq1_to_pq2(const uint8_t* src, uint64_t N, uint64_t K, uint8_t* dst) {
  if (K % kTernaryGroup) fail("ptq1_to_pq2: K = {} is not a multiple of {}", K, kTernaryGroup);
  const uint64_t groups = N * (K / kTernaryGroup);
  uint32_t words[kWordsPerGroup];
  uint16_t d;
  for (uint64_t g = 0; g < groups; ++g) {
    ptq1_decode_block(src + g * kPtq1Bytes, words, &d);
    pq2_encode_block(words, d, dst + g * kPq2Bytes);
  }
}

void pq2_to_ptq1(const uint8_t* src, uint64_t N, uint64_t K, uint8_t* dst, const std::string& what) {
  if (K % kTernaryGroup) fail("{}: K = {} is not a multiple of {}", what, K, kTernaryGroup);
  const uint64_t gpr = K / kTernaryGroup;
  uint32_t words[kWordsPerGroup];
  uint16_t d;
  for (uint64_t r = 0; r < N; ++r)
    for (uint64_t g = 0; g < gpr; ++g) {
      const uint64_t i = r * gpr + g;
      pq2_decode_block(src + i * kPq2Bytes, words, &d);
      if (!ptq1_encode_block(words, d, dst + i * kPtq1Bytes))
        fail("{}: row {} group {} holds code 3 (+2), which PTQ1_0 cannot store", what, r, g);
    }
}

void mlx_check_biases(const uint16_t* scales, const uint16_t* biases, uint64_t N, uint64_t K,
                      const std::string& what) {
  if (K % kTernaryGroup) fail("{}: K = {} is not a multiple of {}", what, K, kTernaryGroup);
  const uint64_t gpr = K / kTernaryGroup;
  for (uint64_t r = 0; r < N; ++r)
    for (uint64_t g = 0; g < gpr; ++g) {
      const uint64_t i = r * gpr + g;
      if (biases[i] != uint16_t(scales[i] ^ 0x8000u))
        fail("{}: row {} group {}: bias {} (0x{:04x}) is not -scale for scale {} (0x{:04x}); "
             "only ternary affine packs (biases = -scales) are supported",
             what, r, g, fp16_to_f32(biases[i]), biases[i], fp16_to_f32(scales[i]), scales[i]);
    }
}

void mlx_make_biases(const uint16_t* scales, uint64_t count, uint16_t* biases) {
  for (uint64_t i = 0; i < count; ++i) biases[i] = uint16_t(scales[i] ^ 0x8000u);
}

// Decision (documented in the header contract "the way the real converter does"): d is max|w| in fp32,
// each w is DIVIDED by that fp32 d (not by the fp16-rounded value that gets stored) and rounded half
// away from zero (C roundf), matching the fork's quantize_row_pq2_0_ref. Since |w/d| <= 1 the codes are
// always 0..2; the comparisons clamp anyway (a NaN weight gives code 1). For weights that are
// already ternary {-s, 0, +s} with s representable in fp16 this reproduces the codes and s exactly.
uint16_t ternary_quantize_group(const float* w, uint32_t* words) {
  float d = 0.0f;
  for (int e = 0; e < kTernaryGroup; ++e) d = std::fmax(d, std::fabs(w[e]));
  for (int i = 0; i < kWordsPerGroup; ++i) words[i] = 0;
  for (int e = 0; e < kTernaryGroup; ++e) {
    int q = 1;
    if (d > 0.0f) {
      const float r = std::round(w[e] / d);  // in {-1, 0, +1} for finite w
      q = r >= 1.0f ? 2 : r <= -1.0f ? 0 : 1;
    }
    words[e >> 4] |= uint32_t(q) << (2 * (e & 15));
  }
  return f32_to_fp16(d);
}

}  // namespace bonsai
