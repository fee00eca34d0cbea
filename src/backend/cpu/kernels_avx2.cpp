// The "avx2" kernel variant: AVX2 + FMA (Haswell / Zen 1 and later). Same algorithms as the AVX-512
// variant (kernels_avx512_impl.h) on 8-lane vectors; the int8 dot products use vpmaddubsw + vpmaddwd
// (no VNNI): one group of 128 codes is one 32-byte vector, its 4 code planes times the activation's 4
// planes are summed in int16 (|.| <= 3048) and widened once.
//
// Every function carries the target attribute itself (not per-file -mavx2), so inline functions of the
// standard headers stay baseline code in this translation unit (no ODR trap).
#include "backend/cpu/kernels.h"
#include "backend/cpu/pq2_rows.h"
#include "backend/cpu/tiles.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "format/ternary_codec.h"

#define TGT __attribute__((target("avx2,fma,popcnt,bmi,bmi2")))
#define TGT_INLINE TGT inline __attribute__((always_inline))

namespace bonsai::cpu {
namespace {

TGT_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
TGT_INLINE int32_t hsum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 8 fp16 bit patterns -> fp32 without F16C: move exponent+mantissa into place and multiply by 2^112
// (rebias 15 -> 127), which also gets zero and subnormals right. Scales are finite (inf/NaN not handled).
TGT_INLINE __m256 fp16x8_to_f32(const uint16_t* h) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  const __m256i mag = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7fff)), 13);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x8000)), 16);
  const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_castsi256_ps(_mm256_set1_epi32(0x77800000)));
  return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

TGT float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// x <- x * sign for 8 lanes: flip the fp32 sign bit where the int8 sign is negative.
TGT_INLINE __m256 apply_signs(__m256 v, const int8_t* s) {
  int64_t bytes;
  std::memcpy(&bytes, s, 8);
  const __m256i w = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes));
  return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0x80000000u)))));
}

// In-register stages h = 1, 2, 4 of one 8-float vector: self + partner, or partner - self for the upper
// element of each pair.
TGT_INLINE __m256 fwht8(__m256 v) {
  __m256 y = _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));
  v = _mm256_blend_ps(_mm256_add_ps(v, y), _mm256_sub_ps(y, v), 0xAA);
  y = _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2));
  v = _mm256_blend_ps(_mm256_add_ps(v, y), _mm256_sub_ps(y, v), 0xCC);
  y = _mm256_permute2f128_ps(v, v, 1);
  v = _mm256_blend_ps(_mm256_add_ps(v, y), _mm256_sub_ps(y, v), 0xF0);
  return v;
}

TGT void fwht_block_avx2(float* x, int64_t n, const int8_t* pre_signs, const int8_t* post_signs, float scale) {
  if (n < 8) {
    portable_kernels().fwht_block(x, n, pre_signs, post_signs, scale);
    return;
  }
  for (int64_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (pre_signs) v = apply_signs(v, pre_signs + i);
    _mm256_storeu_ps(x + i, fwht8(v));
  }
  int64_t h = 8;
  for (; 4 * h <= n; h *= 4)
    for (int64_t i = 0; i < n; i += 4 * h) {
      float* p = x + i;
      for (int64_t j = 0; j < h; j += 8) {
        const __m256 a = _mm256_loadu_ps(p + j), b = _mm256_loadu_ps(p + j + h);
        const __m256 c = _mm256_loadu_ps(p + j + 2 * h), d = _mm256_loadu_ps(p + j + 3 * h);
        const __m256 ab = _mm256_add_ps(a, b), amb = _mm256_sub_ps(a, b);
        const __m256 cd = _mm256_add_ps(c, d), cmd = _mm256_sub_ps(c, d);
        _mm256_storeu_ps(p + j, _mm256_add_ps(ab, cd));
        _mm256_storeu_ps(p + j + h, _mm256_add_ps(amb, cmd));
        _mm256_storeu_ps(p + j + 2 * h, _mm256_sub_ps(ab, cd));
        _mm256_storeu_ps(p + j + 3 * h, _mm256_sub_ps(amb, cmd));
      }
    }
  if (h < n)
    for (int64_t j = 0; j < h; j += 8) {
      const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
      _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
      _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
    }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sc);
    if (post_signs) v = apply_signs(v, post_signs + i);
    _mm256_storeu_ps(x + i, v);
  }
}

// ---- fp32-activation ternary kernels ----------------------------------------------------------------

// 8 codes (16 bits of a word, starting at bit `base`) -> 8 floats (code - 1): lane i shifted by
// base + 2i, then vpermps with an 8-entry table on the low 3 bits, entry k = (k & 3) - 1.
TGT_INLINE __m256 decode8(uint32_t word, __m256i shifts, __m256 lut) {
  return _mm256_permutevar8x32_ps(lut, _mm256_srlv_epi32(_mm256_set1_epi32(int(word)), shifts));
}

// R rows: row r's blocks at w0 + r * ws bytes, output y[r * ys].
template <int R>
TGT_INLINE void f32_rows_x1(const uint8_t* w0, int64_t ws, int64_t K, const float* x, float* y, int64_t ys) {
  const int64_t G = K / 128;
  const __m256i sh_lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i sh_hi = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
  const __m256 lut = _mm256_setr_ps(-1, 0, 1, 2, -1, 0, 1, 2);
  __m256 tot[R];
  for (int r = 0; r < R; ++r) tot[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m256 a[R][2];
    for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int i = 0; i < 8; ++i) {
      const __m256 x0 = _mm256_loadu_ps(x + 128 * g + 16 * i), x1 = _mm256_loadu_ps(x + 128 * g + 16 * i + 8);
      for (int r = 0; r < R; ++r) {
        const uint32_t wd = load_u32(pq2_block_codes(w0 + r * ws + g * kPq2Bytes) + 4 * i);
        a[r][0] = _mm256_fmadd_ps(decode8(wd, sh_lo, lut), x0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(decode8(wd, sh_hi, lut), x1, a[r][1]);
      }
    }
    for (int r = 0; r < R; ++r)
      tot[r] = _mm256_fmadd_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_set1_ps(block_d(w0 + r * ws + g * kPq2Bytes)), tot[r]);
  }
  for (int r = 0; r < R; ++r) y[r * ys] = hsum8(tot[r]);
}

TGT void ternary_rows_x1_avx2(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, float* y) {
  const int64_t rb = row_bytes(K);
  // Two equal runs in lockstep: two long sequential streams (adjacent rows would be short interleaved ones).
  const int64_t Q = (n1 - n0) / 2;
  for (int64_t j = 0; j < Q; ++j) f32_rows_x1<2>(blocks + (n0 + j) * rb, Q * rb, K, x, y + j, Q);
  for (int64_t n = n0 + 2 * Q; n < n1; ++n) f32_rows_x1<1>(blocks + n * rb, rb, K, x, y + (n - n0), 1);
}

// GEMM tile, fp32 activations: R rows of one group decoded (times d, exact) into an L1 tile, then every
// activation row m runs against them.
template <int R>
TGT_INLINE void f32_rows_xm(const uint8_t* w0, int64_t K, const float* x, int64_t M, float* y, int64_t ldy) {
  const int64_t G = K / 128, rb = row_bytes(K);
  const __m256i sh_lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i sh_hi = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
  const __m256 lut = _mm256_setr_ps(-1, 0, 1, 2, -1, 0, 1, 2);
  constexpr int kMT = 32;
  alignas(32) float wt[R][128];
  float acc[kMT][R];
  for (int64_t m0 = 0; m0 < M; m0 += kMT) {
    const int64_t mc = std::min<int64_t>(kMT, M - m0);
    for (int64_t m = 0; m < mc; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = w0 + r * rb + g * kPq2Bytes;
        const __m256 d = _mm256_set1_ps(block_d(blk));
        for (int i = 0; i < 8; ++i) {
          const uint32_t wd = load_u32(pq2_block_codes(blk) + 4 * i);
          _mm256_store_ps(&wt[r][16 * i], _mm256_mul_ps(decode8(wd, sh_lo, lut), d));
          _mm256_store_ps(&wt[r][16 * i + 8], _mm256_mul_ps(decode8(wd, sh_hi, lut), d));
        }
      }
      for (int64_t m = 0; m < mc; ++m) {
        const float* xg = x + (m0 + m) * K + 128 * g;
        __m256 a[R][2];
        for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
        for (int j = 0; j < 128; j += 16) {
          const __m256 x0 = _mm256_loadu_ps(xg + j), x1 = _mm256_loadu_ps(xg + j + 8);
          for (int r = 0; r < R; ++r) {
            a[r][0] = _mm256_fmadd_ps(_mm256_load_ps(&wt[r][j]), x0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(_mm256_load_ps(&wt[r][j + 8]), x1, a[r][1]);
          }
        }
        for (int r = 0; r < R; ++r) acc[m][r] += hsum8(_mm256_add_ps(a[r][0], a[r][1]));
      }
    }
    for (int64_t m = 0; m < mc; ++m)
      for (int r = 0; r < R; ++r) y[(m0 + m) * ldy + r] = acc[m][r];
  }
}

TGT void ternary_rows_xm_avx2(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, int64_t M,
                              float* y, int64_t ldy) {
  const int64_t rb = row_bytes(K);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) f32_rows_xm<4>(blocks + n * rb, K, x, M, y + (n - n0), ldy);
  for (; n < n1; ++n) f32_rows_xm<1>(blocks + n * rb, K, x, M, y + (n - n0), ldy);
}

// ---- int8 activations ---------------------------------------------------------------------------------

// 32 int32 in [-127, 127] (four vectors, natural order) -> 32 int8 in natural order.
TGT_INLINE __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);  // per 128-bit lane
  const __m256i abcd = _mm256_packs_epi16(ab, cd);
  // Lane-wise packing leaves dwords in order a0 b0 c0 d0 | a1 b1 c1 d1 (4 bytes each); restore order.
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

TGT void quantize_q8_avx2(const float* x, int64_t K, int levels, int8_t* q, float* scale, int32_t* sum) {
  const int64_t G = K / 128;
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 base254 = _mm256_set1_ps(254.0f);
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  // Within 16 natural bytes (4 dwords = p .. p+3, byte t of each), gather byte t of every dword: the
  // result's dword t holds plane t for those 4 p's.
  const __m256i to_planes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1,
                                             5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i qword_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < G; ++g) {
    const float* xg = x + 128 * g;
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 128; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(xg + i), absmask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;  // the same scalar ops as the portable kernel
    scale[g] = amax / 127.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    const int64_t c = g / 2, base = 256 * c, P = (2 * c + 1 < G) ? 64 : 32, p_off = (g & 1) * 32;
    __m256i s[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int i = 0; i < 128; i += 32) {
      __m256i v[3][4];
      for (int k = 0; k < 4; ++k) {
        // The digits of kernels.h: round to nearest even, base 254 (no clamp needed).
        const __m256 f = _mm256_mul_ps(_mm256_loadu_ps(xg + i + 8 * k), vinv);
        const __m256 d0 = _mm256_round_ps(f, kRne);
        __m256 dig[3] = {d0, d0, d0};
        if (levels > 1) {
          const __m256 r1 = _mm256_mul_ps(_mm256_sub_ps(f, d0), base254);
          dig[1] = _mm256_round_ps(r1, kRne);
          if (levels > 2) dig[2] = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(r1, dig[1]), base254), kRne);
        }
        for (int l = 0; l < levels; ++l) {
          v[l][k] = _mm256_cvtps_epi32(dig[l]);
          s[l] = _mm256_add_epi32(s[l], v[l][k]);
        }
      }
      // 32 natural bytes = p in [p_off + i/4, +8), t = 0..3 -> 8 bytes of each plane.
      const int64_t p0 = p_off + i / 4;
      for (int l = 0; l < levels; ++l) {
        const __m256i planes = _mm256_permutevar8x32_epi32(
            _mm256_shuffle_epi8(pack32(v[l][0], v[l][1], v[l][2], v[l][3]), to_planes), qword_order);
        alignas(32) int64_t out[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(out), planes);
        for (int t = 0; t < 4; ++t) std::memcpy(q + l * K + base + t * P + p0, &out[t], 8);
      }
    }
    for (int l = 0; l < levels; ++l) sum[l * G + g] = hsum8i(s[l]);
  }
}

// The 4 code planes of one group (32 code bytes).
struct Planes8 {
  __m256i c[4];
};
TGT_INLINE Planes8 planes8(const uint8_t* codes) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  return {{_mm256_and_si256(w, m3), _mm256_and_si256(_mm256_srli_epi16(w, 2), m3),
           _mm256_and_si256(_mm256_srli_epi16(w, 4), m3), _mm256_and_si256(_mm256_srli_epi16(w, 6), m3)}};
}
// Exact integer sum (code - 1) * q of one group against one digit (planes of q0, stride P), as 8 int32
// lanes; the -sum(q) correction rides in lane 0.
TGT_INLINE __m256i group_dot(const Planes8& pl, const int8_t* q0, int64_t P, int32_t qsum) {
  const __m256i p01 =
      _mm256_add_epi16(_mm256_maddubs_epi16(pl.c[0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0))),
                       _mm256_maddubs_epi16(pl.c[1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0 + P))));
  const __m256i p23 =
      _mm256_add_epi16(_mm256_maddubs_epi16(pl.c[2], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0 + 2 * P))),
                       _mm256_maddubs_epi16(pl.c[3], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0 + 3 * P))));
  const __m256i i32 = _mm256_madd_epi16(_mm256_add_epi16(p01, p23), _mm256_set1_epi16(1));
  return _mm256_sub_epi32(i32, _mm256_castsi128_si256(_mm_cvtsi32_si128(qsum)));
}

constexpr float digit_unit(int L) { return L == 1 ? 1.0f : L == 2 ? 1.0f / 254 : 1.0f / 64516; }
// t * 254 + a in int32 lanes (exact: see kernels.h for the range).
TGT_INLINE __m256i times254_add(__m256i t, __m256i a) {
  return _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(t, 8), _mm256_slli_epi32(t, 1)), a);
}

// The activation bytes of group g's plane 0 and the plane stride P.
inline const int8_t* group_q(const int8_t* q, int64_t G, int64_t g, int64_t* P) {
  const int64_t c = g / 2;
  *P = (2 * c + 1 < G) ? 64 : 32;
  return q + 256 * c + (g & 1) * 32;
}

constexpr int64_t kStreamPrefetch = 2048;  // bytes ahead in each row stream (see kernels_avx512_impl.h)

// R rows, L digits: row r's blocks at w0 + r * ws bytes, output y[r * ys].
template <int R, int L>
TGT_INLINE void q8_rows_x1(const uint8_t* w0, int64_t ws, int64_t K, const int8_t* q, const float* qs,
                           const int32_t* qsum, float* y, int64_t ys) {
  const int64_t G = K / 128;
  __m256 facc[R];
  for (int r = 0; r < R; ++r) facc[r] = _mm256_setzero_ps();
  alignas(32) float ds[R][8];
  const __m256 unit = _mm256_set1_ps(digit_unit(L));
  for (int64_t g0 = 0; g0 < G; g0 += 8) {
    const int64_t gn = std::min<int64_t>(8, G - g0);
    // d_g * s_g * unit for the next 8 groups of each row.
    for (int r = 0; r < R; ++r) {
      const uint8_t* b0 = w0 + r * ws + g0 * kPq2Bytes;
      if (gn == 8) {
        alignas(16) uint16_t d8[8];  // the 8 blocks' d, 34 bytes apart
        for (int k = 0; k < 8; ++k) d8[k] = pq2_block_scale(b0 + k * kPq2Bytes);
        _mm256_store_ps(ds[r], _mm256_mul_ps(fp16x8_to_f32(d8), _mm256_mul_ps(_mm256_loadu_ps(qs + g0), unit)));
      } else {
        for (int64_t k = 0; k < gn; ++k) ds[r][k] = block_d(b0 + k * kPq2Bytes) * (qs[g0 + k] * digit_unit(L));
      }
    }
    for (int64_t k = 0; k < gn; ++k) {
      const int64_t g = g0 + k;
      int64_t P;
      const int8_t* qg = group_q(q, G, g, &P);
      for (int r = 0; r < R; ++r) {
        const uint8_t* wc = pq2_block_codes(w0 + r * ws + g * kPq2Bytes);
        if (g & 1) _mm_prefetch(reinterpret_cast<const char*>(wc + kStreamPrefetch), _MM_HINT_T0);
        const Planes8 pl = planes8(wc);
        __m256i i32 = group_dot(pl, qg, P, qsum[g]);
        for (int l = 1; l < L; ++l)  // exact in int32 (kernels.h)
          i32 = times254_add(i32, group_dot(pl, qg + l * K, P, qsum[l * G + g]));
        facc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_broadcast_ss(&ds[r][k]), facc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) y[r * ys] = hsum8(facc[r]);
}

template <int L>
TGT_INLINE void q8_x1_levels(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                             const float* qscale, const int32_t* qsum, float* y) {
  const int64_t rb = row_bytes(K);
  // Two equal runs in lockstep: two long sequential streams, then the leftover row.
  const int64_t Q = (n1 - n0) / 2;
  for (int64_t j = 0; j < Q; ++j) q8_rows_x1<2, L>(blocks + (n0 + j) * rb, Q * rb, K, q, qscale, qsum, y + j, Q);
  for (int64_t n = n0 + 2 * Q; n < n1; ++n) q8_rows_x1<1, L>(blocks + n * rb, rb, K, q, qscale, qsum, y + (n - n0), 1);
}

TGT void ternary_rows_q8_x1_avx2(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                                 const float* qscale, const int32_t* qsum, int levels, float* y) {
  if (levels == 1) q8_x1_levels<1>(blocks, K, n0, n1, q, qscale, qsum, y);
  else if (levels == 2) q8_x1_levels<2>(blocks, K, n0, n1, q, qscale, qsum, y);
  else q8_x1_levels<3>(blocks, K, n0, n1, q, qscale, qsum, y);
}

// q8 GEMM tile, 8 rows per int32 lane set: the 32 code bytes of one group of 8 rows are transposed
// (8 x 8 dwords) so that lane r of T[k] holds row r's code bytes 4k..4k+3; each of its planes multiplies
// the activation plane's bytes 4k..4k+3 broadcast to all lanes, and a lane accumulates a row's whole
// group: the fp32 scaling costs 4 ops per 8 dwords x 4 planes (as in the AVX-512 variant). The decoded
// planes (1 KB) are reused by every activation row m. Row tails (nr < 8) run the same code with zero
// lanes, so results do not depend on where the thread pool cuts the rows.
TGT_INLINE void transpose8x8(__m256i a[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // u[4i + j] lane L: rows 4i..4i+3, element 4L + j
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    a[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    a[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

TGT_INLINE __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The GEMM's activation panel: the digits of every activation row regrouped per (group, pass of kGemmRows<L>
// rows, code dword k) so that the inner loop reads its 4 x MB x L broadcast dwords at fixed offsets from ONE
// pointer (from [M, L, K] each (row, digit) is its own stream: GCC ran out of address registers and reloaded
// them from the stack). Built once per kernel call, shared by every 8-row group of the call.
//   panel int32 [G, NP = ceil(M / MB), 8 k, MB mb, L l, 4 p]   digit l of row pass*MB + mb, plane p, dword k of
//                                                              group g (the plane-permuted dword of kernels.h);
//                                                              rows >= M are zero
template <int L>
constexpr int kGemmRows = L == 1 ? 8 : L == 2 ? 4 : 2;  // MB x L accumulators + code, plane, broadcast <= 16 ymm
template <int L>
int64_t panel_passes(int64_t M) {  // NP
  return (M + kGemmRows<L> - 1) / kGemmRows<L>;
}

// One (row, digit, group) of the panel: its 4 plane rows of 8 dwords (32 bytes at src + p P) transposed 4 x 8, so
// that dword k of the 4 planes lands as 16 bytes at dst + k * kstride (in int32 units).
TGT_INLINE void pack_group_dwords(const int8_t* src, int64_t P, int32_t* dst, int64_t kstride) {
  __m256i r[4];
  for (int p = 0; p < 4; ++p) r[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + p * P));
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                        _mm256_unpackhi_epi64(t1, t3)};  // u[i]: dword i of the 4 planes | dword i + 4
  for (int i = 0; i < 4; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * kstride), _mm256_castsi256_si128(u[i]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (i + 4) * kstride), _mm256_extracti128_si256(u[i], 1));
  }
}

template <int L>
TGT void pack_gemm_panel(const int8_t* q, int64_t M, int64_t K, std::vector<int32_t>& panel) {
  constexpr int MB = kGemmRows<L>;
  const int64_t G = K / 128, NP = panel_passes<L>(M);
  panel.resize(size_t(G * NP * 8 * MB * L * 4));
  for (int64_t g = 0; g < G; ++g) {
    int64_t P;
    const int8_t* qg0 = group_q(q, G, g, &P);
    int32_t* pg = panel.data() + g * NP * 8 * MB * L * 4;
    for (int64_t m = 0; m < NP * MB; ++m)
      for (int l = 0; l < L; ++l) {
        int32_t* dst = pg + ((m / MB) * 8 * MB + m % MB) * L * 4 + l * 4;
        if (m < M) {
          pack_group_dwords(qg0 + m * L * K + l * K, P, dst, MB * L * 4);
        } else {  // a padding row of the last pass: zero digits
          for (int k = 0; k < 8; ++k) std::memset(dst + k * MB * L * 4, 0, 16);
        }
      }
  }
}

// MB activation rows of a panel pass of PR rows (x = the first row's dword 0 of this group in it), L digits, against one group of 8
// rows: cv = the group's 8 code vectors (lane r = row r's code bytes 4k..4k+3; vector k at cv + k * cs);
// qs / qsum at row 0's group scale / digit-0 sum (digit l at + l * G, rows G / srs apart).
// facc[mb] (8 rows) += the group's exactly summed dot, scaled by d x s x unit.
// The 4-products stay in 16 bits for the whole group (one vpaddw per vpmaddubsw; |pair| <= 2 x 3 x 127, 32 of
// them per lane: < 2^15 for any codes) and are widened once per group: per 32 multiply-adds one vpmaddubsw, one
// vpaddw and one broadcast load, where the 4-product form spent vpmaddwd + vpaddd on every four planes (and
// GCC kept its 32 plane registers on the stack). Each plane of a code vector is extracted once per MB rows.
template <int MB, int L, int PR = MB>
TGT_INLINE void gemm8_group(const uint8_t* cv, int64_t cs, const int32_t* x, const float* qs, const int32_t* qsum,
                            int64_t G, int64_t srs, __m256 d, __m256* facc) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256i acc[MB][L];  // 16 int16 pair sums of 8 rows
  for (int mb = 0; mb < MB; ++mb)
    for (int l = 0; l < L; ++l) acc[mb][l] = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(cv + k * cs));
    const int32_t* xk = x + k * PR * L * 4;
    for (int p = 0; p < 4; ++p) {  // plane-major: one plane register live, so MB x L accumulators stay in registers
      const __m256i pl = _mm256_and_si256(p ? _mm256_srli_epi16(a, 2 * p) : a, m3);
      for (int mb = 0; mb < MB; ++mb)
        for (int l = 0; l < L; ++l) {
          acc[mb][l] = _mm256_add_epi16(acc[mb][l], _mm256_maddubs_epi16(pl, _mm256_set1_epi32(xk[(mb * L + l) * 4 + p])));
          asm("" : "+x"(acc[mb][l]));  // keeps GCC from reassociating the adds into trees of live products
        }
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int mb = 0; mb < MB; ++mb) {
    __m256i tot = _mm256_sub_epi32(_mm256_madd_epi16(acc[mb][0], ones), _mm256_set1_epi32(qsum[mb * srs]));
    for (int l = 1; l < L; ++l)  // exact in int32 (kernels.h)
      tot = times254_add(tot, _mm256_sub_epi32(_mm256_madd_epi16(acc[mb][l], ones), _mm256_set1_epi32(qsum[mb * srs + l * G])));
    facc[mb] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d, _mm256_set1_ps(qs[mb * G] * digit_unit(L))),
                               facc[mb]);
  }
}

// Rows m0 .. m0 + mc - 1 (m0 a multiple of kGemmRows<L>) against one group g of 8 rows, a pass at a time.
// facc has room for mc rounded up to a pass (the padding rows' sums are never stored).
template <int L>
TGT_INLINE void gemm8_rows(const uint8_t* cv, int64_t cs, const int32_t* panel, int64_t NP, int64_t g, const float* qs,
                           const int32_t* qsum, int64_t G, int64_t srs, __m256 d, int64_t m0, int64_t mc, __m256* facc) {
  constexpr int MB = kGemmRows<L>;
  for (int64_t m = 0; m < mc; m += MB) {
    const int32_t* x = panel + (g * NP + (m0 + m) / MB) * 8 * MB * L * 4;
    const int64_t rows = std::min<int64_t>(MB, mc - m);
    if (rows == MB) {
      gemm8_group<MB, L>(cv, cs, x, qs + (m0 + m) * G + g, qsum + (m0 + m) * srs + g, G, srs, d, facc + m);
    } else {  // the last rows of the panel's last pass, one at a time
      for (int64_t r = 0; r < rows; ++r)
        gemm8_group<1, L, MB>(cv, cs, x + r * L * 4, qs + (m0 + m + r) * G + g, qsum + (m0 + m + r) * srs + g, G, srs, d,
                              facc + m + r);
    }
  }
}

template <int L>
TGT void q8_rows8_xm(const uint8_t* w0, int64_t rb, int64_t K, const int32_t* panel, const float* qs, const int32_t* qsum,
                     int64_t M, float* y, int64_t ldy, int nr) {
  const int64_t G = K / 128, srs = L * G, NP = panel_passes<L>(M);
  constexpr int kMT = 64;
  alignas(32) uint8_t tr[8 * 32];  // one group of 8 rows transposed: [dword k][row r] (8 code vectors)
  alignas(32) __m256 facc[kMT];
  for (int64_t m0 = 0; m0 < M; m0 += kMT) {
    const int64_t mc = std::min<int64_t>(kMT, M - m0);
    for (int64_t m = 0; m < mc; ++m) facc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      __m256i a[8];
      alignas(32) float dr[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < 8; ++r) {
        const uint8_t* blk = w0 + r * rb + g * kPq2Bytes;
        a[r] = r < nr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pq2_block_codes(blk))) : _mm256_setzero_si256();
        if (r < nr) dr[r] = block_d(blk);
      }
      transpose8x8(a);
      for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(tr + 32 * k), a[k]);
      gemm8_rows<L>(tr, 32, panel, NP, g, qs, qsum, G, srs, _mm256_load_ps(dr), m0, mc, facc);
    }
    for (int64_t m = 0; m < mc; ++m) {
      alignas(32) float out[8];
      _mm256_store_ps(out, facc[m]);
      std::memcpy(y + (m0 + m) * ldy, out, sizeof(float) * size_t(nr));
    }
  }
}

// The calling thread's GEMM panel (pack_gemm_panel), reused across calls.
std::vector<int32_t>& gemm_panel() {
  static thread_local std::vector<int32_t> panel;
  return panel;
}

template <int L>
TGT void q8_xm_levels(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q, const float* qscale,
                      const int32_t* qsum, int64_t M, float* y, int64_t ldy) {
  std::vector<int32_t>& panel = gemm_panel();
  pack_gemm_panel<L>(q, M, K, panel);
  const int64_t rb = row_bytes(K);
  for (int64_t n = n0; n < n1; n += 8)
    q8_rows8_xm<L>(blocks + n * rb, rb, K, panel.data(), qscale, qsum, M, y + (n - n0), ldy,
                   int(std::min<int64_t>(8, n1 - n)));
}

TGT void ternary_rows_q8_xm_avx2(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                                 const float* qscale, const int32_t* qsum, int levels, int64_t M, float* y, int64_t ldy) {
  if (levels == 1) q8_xm_levels<1>(blocks, K, n0, n1, q, qscale, qsum, M, y, ldy);
  else if (levels == 2) q8_xm_levels<2>(blocks, K, n0, n1, q, qscale, qsum, M, y, ldy);
  else q8_xm_levels<3>(blocks, K, n0, n1, q, qscale, qsum, M, y, ldy);
}

}  // namespace

namespace {
// ---- the tiled layout (backend/cpu/tiles.h) ----------------------------------------------------------------
// A tile's 64-byte code vector (dword j of 16 rows) is two ymm halves: rows 0-7, rows 8-15. Lane r of a half
// holds row r's code bytes 4j..4j+3, exactly what transpose8x8 builds in the canonical GEMM, so the tiled
// GEMM is the canonical one with loads for its transposes (bit-identical), and the matvec puts 8 ROWS in the
// int32 lanes at M = 1 too: one aligned load per 128 weights, and each activation broadcast serves every half
// of the T tiles walked in lockstep.
//
// Matvec: no VNNI, so a 4-product is vpmaddubsw (u8 code plane x s8 digit -> 16-bit pair sums) + vpmaddwd
// (-> int32). The pair sums are kept in 16 bits for a whole group instead (one vpaddw per vpmaddubsw, one
// vpmaddwd per group): |pair| <= 2 * 3 * 127 = 762, times 4 planes x 8 dwords = 24,384 < 2^15, whatever the
// codes (even the unused code 3). Per 128 weights and digit: 4 vpmaddubsw + 4 vpaddw, against 4 + 4 + 4
// (vpmaddubsw, vpmaddwd, vpaddd) for the emulated 4-product.

constexpr int64_t kTileStreamPrefetch = 2048;  // bytes ahead in each tile stream (as the canonical streams)

// One group of T tiles in lockstep (see tiles_x1_group in kernels_avx512_tiles.h for the arguments);
// facc[2t + h] = rows 8h .. 8h+7 of tile t.
template <int T, int L, int P>
TGT_INLINE void tiles8_x1_group(const uint8_t* const* codes, const uint8_t* const* dv, const int8_t* qg, int64_t K,
                                const int32_t* qsum_g, int64_t G, float s, __m256* facc) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256i acc[2 * T][L];  // [tile half][digit] 16 int16 pair sums of 8 rows (see above for the range)
  for (int u = 0; u < 2 * T; ++u)
    for (int l = 0; l < L; ++l) acc[u][l] = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    for (int t = 0; t < T; ++t)
      _mm_prefetch(reinterpret_cast<const char*>(codes[t] + 64 * j + kTileStreamPrefetch), _MM_HINT_T0);
    // Plane-major: per plane, L broadcasts and one plane register live (not 4L broadcasts), so 2T x L
    // accumulators fit the 16 ymm registers at T = 2, L = 2.
    for (int p = 0; p < 4; ++p) {
      __m256i x[L];
      for (int l = 0; l < L; ++l) x[l] = bcast32(qg + l * K + p * P + 4 * j);
      for (int u = 0; u < 2 * T; ++u) {
        const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes[u / 2] + 64 * j + 32 * (u % 2)));
        const __m256i pl = _mm256_and_si256(p ? _mm256_srli_epi16(a, 2 * p) : a, m3);
        for (int l = 0; l < L; ++l) {
          acc[u][l] = _mm256_add_epi16(acc[u][l], _mm256_maddubs_epi16(pl, x[l]));
          // An opaque step: without it GCC reassociates a j's four adds into a tree over the four planes'
          // products, which holds 4 x 2T x L products live and spilled them (39 -> ? GMAC/s in L2).
          asm("" : "+x"(acc[u][l]));
        }
      }
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 sv = _mm256_set1_ps(s);
  for (int u = 0; u < 2 * T; ++u) {
    __m256i tot = _mm256_sub_epi32(_mm256_madd_epi16(acc[u][0], ones), _mm256_set1_epi32(qsum_g[0]));
    for (int l = 1; l < L; ++l)
      tot = times254_add(tot, _mm256_sub_epi32(_mm256_madd_epi16(acc[u][l], ones), _mm256_set1_epi32(qsum_g[l * G])));
    const __m256 d = fp16x8_to_f32(reinterpret_cast<const uint16_t*>(dv[u / 2] + 16 * (u % 2)));
    facc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d, sv), facc[u]);
  }
}

// T whole tiles against one quantised activation row: facc[2t + h] = rows 8h .. 8h+7 of tile t.
template <int T, int L>
TGT_INLINE void tiles8_x1_run(const uint8_t* const* tile, int64_t K, const int8_t* q, const float* qs,
                              const int32_t* qsum, __m256* facc) {
  const int64_t G = K / 128;
  for (int u = 0; u < 2 * T; ++u) facc[u] = _mm256_setzero_ps();
  const uint8_t* codes[T];
  const uint8_t* dv[T];
  for (int64_t g = 0; g < G; ++g) {
    for (int t = 0; t < T; ++t) {
      codes[t] = tile[t] + tile_group_codes(G, g);
      dv[t] = tile[t] + tile_group_d(G, g);
    }
    int64_t P;  // 64, or 32 in the tail chunk of an odd G
    const int8_t* qg = group_q(q, G, g, &P);
    if (P == 64) tiles8_x1_group<T, L, 64>(codes, dv, qg, K, qsum + g, G, qs[g] * digit_unit(L), facc);
    else tiles8_x1_group<T, L, 32>(codes, dv, qg, K, qsum + g, G, qs[g] * digit_unit(L), facc);
  }
}

// Tile t's 16 outputs (two halves) into y[16t ..], clipped at N.
TGT_INLINE void store_tile_rows8(float* y, int64_t N, int64_t t, __m256 lo, __m256 hi) {
  const int64_t n = t * kTileRows, left = N - n;
  if (left >= kTileRows) {
    _mm256_storeu_ps(y + n, lo);
    _mm256_storeu_ps(y + n + 8, hi);
    return;
  }
  alignas(32) float out[16];
  _mm256_store_ps(out, lo);
  _mm256_store_ps(out + 8, hi);
  std::memcpy(y + n, out, sizeof(float) * size_t(left));
}

template <int L>
TGT void q8_tiles8_x1_levels(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                             const float* qs, const int32_t* qsum, float* y) {
  const int64_t tb = tile_bytes(K);
  // Two equal runs of tiles in lockstep (two long streams per thread, as the AVX-512 kernel), then the odd tile.
  const int64_t Q = (t1 - t0) / 2;
  for (int64_t j = 0; j < Q; ++j) {
    const int64_t ta = t0 + j, tz = t0 + Q + j;
    const uint8_t* tile[2] = {tiles + ta * tb, tiles + tz * tb};
    __m256 facc[4];
    tiles8_x1_run<2, L>(tile, K, q, qs, qsum, facc);
    store_tile_rows8(y, N, ta, facc[0], facc[1]);
    store_tile_rows8(y, N, tz, facc[2], facc[3]);
  }
  if (t0 + 2 * Q < t1) {
    const int64_t t = t1 - 1;
    const uint8_t* tile[1] = {tiles + t * tb};
    __m256 facc[2];
    tiles8_x1_run<1, L>(tile, K, q, qs, qsum, facc);
    store_tile_rows8(y, N, t, facc[0], facc[1]);
  }
}

TGT void ternary_tiles_q8_x1_avx2(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                                  const float* qscale, const int32_t* qsum, int levels, float* y) {
  if (levels == 1) q8_tiles8_x1_levels<1>(tiles, K, N, t0, t1, q, qscale, qsum, y);
  else if (levels == 2) q8_tiles8_x1_levels<2>(tiles, K, N, t0, t1, q, qscale, qsum, y);
  else q8_tiles8_x1_levels<3>(tiles, K, N, t0, t1, q, qscale, qsum, y);
}

// GEMM on one tile half (8 rows: nr of them real): q8_rows8_xm with the stored transpose read in place and the 8
// rows' d loaded as one vector, so the same gemm8_group runs on the same code vectors (bit-identical).
template <int L>
TGT void q8_tile8_xm(const uint8_t* tile, int half, int64_t K, const int32_t* panel, const float* qs, const int32_t* qsum,
                     int64_t M, float* y, int64_t ldy, int nr) {
  const int64_t G = K / 128, srs = L * G, NP = panel_passes<L>(M);
  constexpr int kMT = 64;
  alignas(32) __m256 facc[kMT];  // [m] 8 rows
  for (int64_t m0 = 0; m0 < M; m0 += kMT) {
    const int64_t mc = std::min<int64_t>(kMT, M - m0);
    for (int64_t m = 0; m < mc; ++m) facc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* cv = tile + tile_group_codes(G, g) + 32 * half;  // this group's 8 code vectors, 64 B apart
      const uint8_t* dv = tile + tile_group_d(G, g) + 16 * half;
      gemm8_rows<L>(cv, 64, panel, NP, g, qs, qsum, G, srs, fp16x8_to_f32(reinterpret_cast<const uint16_t*>(dv)), m0, mc,
                    facc);
    }
    for (int64_t m = 0; m < mc; ++m) {
      alignas(32) float out[8];
      _mm256_store_ps(out, facc[m]);
      std::memcpy(y + (m0 + m) * ldy, out, sizeof(float) * size_t(nr));
    }
  }
}

template <int L>
TGT void q8_tiles8_xm_levels(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                             const float* qscale, const int32_t* qsum, int64_t M, float* y, int64_t ldy) {
  std::vector<int32_t>& panel = gemm_panel();
  pack_gemm_panel<L>(q, M, K, panel);
  const int64_t tb = tile_bytes(K);
  for (int64_t t = t0; t < t1; ++t)
    for (int half = 0; half < 2; ++half) {
      const int64_t n = t * kTileRows + 8 * half;
      if (n >= N) break;
      q8_tile8_xm<L>(tiles + t * tb, half, K, panel.data(), qscale, qsum, M, y + n, ldy, int(std::min<int64_t>(8, N - n)));
    }
}

TGT void ternary_tiles_q8_xm_avx2(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                                  const float* qscale, const int32_t* qsum, int levels, int64_t M, float* y,
                                  int64_t ldy) {
  if (levels == 1) q8_tiles8_xm_levels<1>(tiles, K, N, t0, t1, q, qscale, qsum, M, y, ldy);
  else if (levels == 2) q8_tiles8_xm_levels<2>(tiles, K, N, t0, t1, q, qscale, qsum, M, y, ldy);
  else q8_tiles8_xm_levels<3>(tiles, K, N, t0, t1, q, qscale, qsum, M, y, ldy);
}

}  // namespace

namespace detail {
const Kernels* avx2_kernels() {
  static const Kernels k{"avx2",
                         fwht_block_avx2,
                         ternary_rows_x1_avx2,
                         ternary_rows_xm_avx2,
                         dot_avx2,
                         quantize_q8_avx2,
                         ternary_rows_q8_x1_avx2,
                         ternary_rows_q8_xm_avx2,
                         ternary_tiles_q8_x1_avx2,
                         ternary_tiles_q8_xm_avx2};
  return &k;
}
}  // namespace detail
}  // namespace bonsai::cpu

#else  // not x86-64
namespace bonsai::cpu::detail {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace bonsai::cpu::detail
#endif
