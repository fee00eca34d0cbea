// AVX-512 kernel bodies, compiled twice: kernels_avx512vnni.cpp (BONSAI_AVX512_VNNI 1: vpdpbusd) and
// kernels_avx512bw.cpp (BONSAI_AVX512_VNNI 0: vpmaddubsw + vpmaddwd). Include from exactly those two files.
//
// Every function carries the target attribute itself (BONSAI_AVX512_TARGET) instead of the file being
// compiled with -mavx512*: inline functions from the standard headers then stay baseline x86-64 code, so
// the linker can never pick an AVX-512 copy of one for the whole program (the classic per-file-flags trap).
//
// int8 ("q8") matvec on the canonical blocks (the decode when no tiles were built; the tiled one, the decode
// workhorse, is in kernels_avx512_tiles.h). Per row and chunk of 256 elements (two groups of 128):
//   - the 64 code bytes of the chunk's two PQ2_0 blocks, two 32-byte loads (byte p = elements 4p..4p+3 at bits 2t);
//   - plane t = (codes >> 2t) & 3: unsigned bytes {0,1,2(,3)}, lined up with the activation's plane t
//     (the activation is plane-permuted once per site by quantize_q8, see kernels.h);
//   - 4 x vpdpbusd (u8 codes x s8 activations, 4 products per int32 lane): lanes 0-7 sum group 2c,
//     lanes 8-15 group 2c+1. The accumulator starts at -sum(q) of each group (lane 0 / lane 8), so it ends
//     at the exact integer sum (code - 1) * q of the group: no fp32 cancellation.
//   - one int->fp32 conversion and one FMA with d_g * s_g spread over the matching 8 lanes.
//   - q16 / q24 (2 / 3 activation digits, kernels.h): the decoded planes are reused for each digit's 4
//     vpdpbusd, and the digit dots are combined exactly in int32 (t * 254 + next) before the conversion.
//     Measured in L2 on Zen 4, per core: q8 25 GB/s, q16 18 GB/s, q24 12.5 GB/s (ALU-bound), fp32 6 GB/s.
// Eight rows share each activation load; the dpbusd chains of the eight rows are independent.
// Memory: the eight rows are NOT adjacent. A thread's row range is cut into eight equal runs walked in
// lockstep (row j of each run together), so each run is one long sequential stream, and each stream is
// prefetched 2 KB ahead. Measured on Zen 4 (K=5120, N=17408, one thread, per busy core): four adjacent
// rows (four short interleaved streams, 1.3 KB each) 7-8 GB/s; one row at a time 11-14 GB/s (compute
// bound at 16 GB/s); four long streams 14-17 GB/s, with the 2 KB prefetch 17-18 GB/s.
//
// The GEMMs (M > 1, prefill) put 16 ROWS in the 16 lanes instead (codes transposed once per chunk and
// reused by every activation row, activation values broadcast): see "q8 GEMM" and "fp32 GEMM" below.
//
// GCC 12 warns inside its own AVX-512 headers (_mm256_undefined_* "used uninitialized") when intrinsics
// are inlined into target-attribute functions: a false positive, silenced for this file only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/pq2_rows.h"
#include "backend/cpu/tiles.h"
#include "format/ternary_codec.h"

#if BONSAI_AVX512_VNNI
#define BONSAI_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,popcnt,bmi,bmi2")))
#else
#define BONSAI_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,popcnt,bmi,bmi2")))
#endif
#define TGT BONSAI_AVX512_TARGET
#define TGT_INLINE BONSAI_AVX512_TARGET inline __attribute__((always_inline))

namespace bonsai::cpu {
namespace {

// ---- weight layout helpers ----------------------------------------------------------------------------
// Weights are PQ2_0 blocks (kernels.h): row n at blocks + n * rb, rb = (K/128) * 34; group g's block at
// + 34 g: fp16 d, then the 32 code bytes (unaligned); row_bytes / load_u32 / block_d: pq2_rows.h.
// A chunk c (groups 2c, 2c+1) is the 68 bytes at + 68 c.

// The 64 code bytes of a chunk (two blocks): two 32-byte loads around the second block's d.
TGT_INLINE __m512i chunk_codes(const uint8_t* chunk) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 2));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + kPq2Bytes + 2));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// fp16 d of the blocks at base + idx[i] bytes (lanes in `m`; 0 elsewhere) as 16 floats. A dword gather
// reads d and the first 2 code bytes of the block, so it never reads past a block.
TGT_INLINE __m512 gather_d(const uint8_t* base, __m512i idx, __mmask16 m) {
  const __m512i dw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, base, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
}

// ---- fp32 helpers ----------------------------------------------------------------------------------

TGT float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

// x <- x * sign for 16 lanes; signs int8 +-1: the sign bit of each byte says "negate".
TGT_INLINE __m512 apply_signs(__m512 v, const int8_t* s) {
  const __mmask16 neg = _mm_movepi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  return _mm512_mask_sub_ps(v, neg, _mm512_setzero_ps(), v);
}

// The four in-register butterfly stages (h = 1, 2, 4, 8) of one 16-float vector. For lanes with bit h set
// the result is partner - self (= a_lo - a_hi), for the others self + partner.
TGT_INLINE __m512 fwht16(__m512 v) {
  __m512 y = _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));
  v = _mm512_mask_sub_ps(_mm512_add_ps(v, y), 0xAAAA, y, v);
  y = _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2));
  v = _mm512_mask_sub_ps(_mm512_add_ps(v, y), 0xCCCC, y, v);
  y = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1));
  v = _mm512_mask_sub_ps(_mm512_add_ps(v, y), 0xF0F0, y, v);
  y = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
  v = _mm512_mask_sub_ps(_mm512_add_ps(v, y), 0xFF00, y, v);
  return v;
}

TGT void fwht_block_avx512(float* x, int64_t n, const int8_t* pre_signs, const int8_t* post_signs, float scale) {
  if (n < 16) {  // too short for a vector: the portable code
    portable_kernels().fwht_block(x, n, pre_signs, post_signs, scale);
    return;
  }
  // Stages 1..8 inside each vector (signs applied on the way in).
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    if (pre_signs) v = apply_signs(v, pre_signs + i);
    _mm512_storeu_ps(x + i, fwht16(v));
  }
  // Stages h >= 16 across vectors, two at a time (radix 4) as in the portable kernel: half the traffic.
  int64_t h = 16;
  for (; 4 * h <= n; h *= 4)
    for (int64_t i = 0; i < n; i += 4 * h) {
      float* p = x + i;
      for (int64_t j = 0; j < h; j += 16) {
        const __m512 a = _mm512_loadu_ps(p + j), b = _mm512_loadu_ps(p + j + h);
        const __m512 c = _mm512_loadu_ps(p + j + 2 * h), d = _mm512_loadu_ps(p + j + 3 * h);
        const __m512 ab = _mm512_add_ps(a, b), amb = _mm512_sub_ps(a, b);
        const __m512 cd = _mm512_add_ps(c, d), cmd = _mm512_sub_ps(c, d);
        _mm512_storeu_ps(p + j, _mm512_add_ps(ab, cd));
        _mm512_storeu_ps(p + j + h, _mm512_add_ps(amb, cmd));
        _mm512_storeu_ps(p + j + 2 * h, _mm512_sub_ps(ab, cd));
        _mm512_storeu_ps(p + j + 3 * h, _mm512_sub_ps(amb, cmd));
      }
    }
  if (h < n)  // one radix-2 stage left
    for (int64_t j = 0; j < h; j += 16) {
      const __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + h);
      _mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
      _mm512_storeu_ps(x + j + h, _mm512_sub_ps(a, b));
    }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), sc);
    if (post_signs) v = apply_signs(v, post_signs + i);
    _mm512_storeu_ps(x + i, v);
  }
}

// ---- fp32-activation ternary kernels (the exact path) -----------------------------------------------

// 16 codes of one word -> 16 floats (code - 1): shift lane i right by 2i, then vpermps with a 16-entry
// table indexed by the low 4 bits (two codes), entry k = (k & 3) - 1, so no mask is needed.
TGT_INLINE __m512 decode16(uint32_t word, __m512i shifts, __m512 lut) {
  return _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi32(int(word)), shifts), lut);
}
TGT_INLINE __m512 code_lut() {
  return _mm512_setr_ps(-1, 0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2);
}
TGT_INLINE __m512i code_shifts() {
  return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
}

// R rows: row r's blocks at w0 + r * ws bytes, output y[r * ys].
template <int R>
TGT_INLINE void f32_rows_x1(const uint8_t* w0, int64_t ws, int64_t K, const float* x, float* y, int64_t ys) {
  const int64_t G = K / 128;
  const __m512i shifts = code_shifts();
  const __m512 lut = code_lut();
  __m512 tot[R];
  for (int r = 0; r < R; ++r) tot[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512 a[R][2];
    for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int i = 0; i < 8; i += 2) {
      const __m512 x0 = _mm512_loadu_ps(x + 128 * g + 16 * i), x1 = _mm512_loadu_ps(x + 128 * g + 16 * i + 16);
      for (int r = 0; r < R; ++r) {
        const uint8_t* wr = pq2_block_codes(w0 + r * ws + g * kPq2Bytes);
        a[r][0] = _mm512_fmadd_ps(decode16(load_u32(wr + 4 * i), shifts, lut), x0, a[r][0]);
        a[r][1] = _mm512_fmadd_ps(decode16(load_u32(wr + 4 * i + 4), shifts, lut), x1, a[r][1]);
      }
    }
    for (int r = 0; r < R; ++r)
      tot[r] = _mm512_fmadd_ps(_mm512_add_ps(a[r][0], a[r][1]), _mm512_set1_ps(block_d(w0 + r * ws + g * kPq2Bytes)), tot[r]);
  }
  for (int r = 0; r < R; ++r) y[r * ys] = _mm512_reduce_add_ps(tot[r]);
}

TGT void ternary_rows_x1_avx512(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, float* y) {
  const int64_t rb = row_bytes(K);
  // Two equal runs in lockstep: two long sequential streams (see the q8 matvec below).
  const int64_t Q = (n1 - n0) / 2;
  for (int64_t j = 0; j < Q; ++j) f32_rows_x1<2>(blocks + (n0 + j) * rb, Q * rb, K, x, y + j, Q);
  for (int64_t n = n0 + 2 * Q; n < n1; ++n) f32_rows_x1<1>(blocks + n * rb, rb, K, x, y + (n - n0), 1);
}

// ---- int8 activations ---------------------------------------------------------------------------------

// One group of 128 floats -> scale, and the group's `levels` int8 digits in natural order into
// nat[l][128 * h ...] (row stride 256); sums[l] = sum of digit l.
TGT_INLINE void quantize_group(const float* xg, int levels, int8_t (*nat)[256], int32_t* sums, float* scale) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  __m512 mx = _mm512_setzero_ps();
  for (int i = 0; i < 128; i += 16) mx = _mm512_max_ps(mx, _mm512_and_ps(_mm512_loadu_ps(xg + i), absmask));
  const float amax = _mm512_reduce_max_ps(mx);
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;  // the same scalar ops as the portable kernel
  *scale = amax / 127.0f;
  const __m512 vinv = _mm512_set1_ps(inv), base = _mm512_set1_ps(254.0f);
  __m512i s[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int i = 0; i < 128; i += 16) {
    // The digits of kernels.h (round to nearest even, as the portable kernel; base 254 needs no clamp).
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xg + i), vinv);
    const __m512 d0 = _mm512_roundscale_ps(v, kRne);
    __m512 dig[3] = {d0, d0, d0};
    if (levels > 1) {
      const __m512 r1 = _mm512_mul_ps(_mm512_sub_ps(v, d0), base);
      dig[1] = _mm512_roundscale_ps(r1, kRne);
      if (levels > 2) dig[2] = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(r1, dig[1]), base), kRne);
    }
    for (int l = 0; l < levels; ++l) {
      const __m512i di = _mm512_cvtps_epi32(dig[l]);  // already integral: exact
      s[l] = _mm512_add_epi32(s[l], di);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(&nat[l][i]), _mm512_cvtepi32_epi8(di));
    }
  }
  for (int l = 0; l < levels; ++l) sums[l] = _mm512_reduce_add_epi32(s[l]);
}

TGT void quantize_q8_avx512(const float* x, int64_t K, int levels, int8_t* q, float* scale, int32_t* sum) {
  const int64_t G = K / 128;
  alignas(64) int8_t nat[3][256];
  for (int64_t c = 0; 2 * c < G; ++c) {
    const int64_t g = 2 * c, groups = std::min<int64_t>(2, G - g), P = 32 * groups;
    for (int64_t h = 0; h < groups; ++h) {
      int32_t sums[3];
      int8_t(*nat_h)[256] = reinterpret_cast<int8_t(*)[256]>(&nat[0][128 * h]);
      quantize_group(x + 128 * (g + h), levels, nat_h, sums, scale + g + h);
      for (int l = 0; l < levels; ++l) sum[l * G + g + h] = sums[l];
    }
    // Natural bytes 4p + t -> plane t byte p: read them as int32 p (bytes t = 0..3), shift byte t down
    // and keep the low byte of each dword (vpmovdb).
    for (int l = 0; l < levels; ++l) {
      int8_t* qc = q + l * K + 256 * c;
      for (int64_t p0 = 0; p0 < P; p0 += 16) {
        const __m512i d = _mm512_loadu_si512(&nat[l][4 * p0]);
        for (int t = 0; t < 4; ++t)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(qc + t * P + p0), _mm512_cvtepi32_epi8(_mm512_srli_epi32(d, 8 * t)));
      }
    }
  }
}

// Sum over the 4 planes of plane_t (u8 codes) x act_t (s8), added to acc (int32, 4 bytes per lane).
TGT_INLINE __m512i dot4_planes(__m512i acc, __m512i c0, __m512i c1, __m512i c2, __m512i c3, __m512i x0, __m512i x1,
                               __m512i x2, __m512i x3) {
#if BONSAI_AVX512_VNNI
  acc = _mm512_dpbusd_epi32(acc, c0, x0);
  acc = _mm512_dpbusd_epi32(acc, c1, x1);
  acc = _mm512_dpbusd_epi32(acc, c2, x2);
  acc = _mm512_dpbusd_epi32(acc, c3, x3);
  return acc;
#else
  // vpmaddubsw: pairs of u8*s8 -> s16 (|.| <= 2*3*127, no saturation); the 4 planes summed in s16
  // (|.| <= 3048) and widened once with vpmaddwd against ones.
  const __m512i p01 = _mm512_add_epi16(_mm512_maddubs_epi16(c0, x0), _mm512_maddubs_epi16(c1, x1));
  const __m512i p23 = _mm512_add_epi16(_mm512_maddubs_epi16(c2, x2), _mm512_maddubs_epi16(c3, x3));
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_add_epi16(p01, p23), _mm512_set1_epi16(1)));
#endif
}
TGT_INLINE __m256i dot4_planes256(__m256i acc, __m256i c0, __m256i c1, __m256i c2, __m256i c3, __m256i x0, __m256i x1,
                                  __m256i x2, __m256i x3) {
#if BONSAI_AVX512_VNNI
  acc = _mm256_dpbusd_epi32(acc, c0, x0);
  acc = _mm256_dpbusd_epi32(acc, c1, x1);
  acc = _mm256_dpbusd_epi32(acc, c2, x2);
  acc = _mm256_dpbusd_epi32(acc, c3, x3);
  return acc;
#else
  const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(c0, x0), _mm256_maddubs_epi16(c1, x1));
  const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(c2, x2), _mm256_maddubs_epi16(c3, x3));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_add_epi16(p01, p23), _mm256_set1_epi16(1)));
#endif
}

// The 4 code planes of the 64 code bytes of a chunk (two blocks).
struct Planes {
  __m512i p[4];
};
// (A GFNI variant, one gf2p8affineqb per plane instead of shift + mask, measured no faster on Zen 4:
// gf2p8affineqb competes with vpdpbusd for the same two pipes, the shifts and masks do not.)
TGT_INLINE Planes planes(const uint8_t* chunk) {
  const __m512i w = chunk_codes(chunk);
  const __m512i m3 = _mm512_set1_epi8(3);
  // 16-bit shifts are fine: the mask drops the bits that cross from the neighbouring byte.
  return {{_mm512_and_si512(w, m3), _mm512_and_si512(_mm512_srli_epi16(w, 2), m3),
           _mm512_and_si512(_mm512_srli_epi16(w, 4), m3), _mm512_and_si512(_mm512_srli_epi16(w, 6), m3)}};
}

// -sum(q) of groups 2c and 2c+1 in lanes 0 and 8 (zeros elsewhere): a dpbusd accumulator started there
// ends at the exact sum (code - 1) * q of each group.
TGT_INLINE __m512i neg_sums(const int32_t* qsum2) {
  const __m512i two = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qsum2)));
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_maskz_permutexvar_epi32(0x0101, idx, two));
}

TGT_INLINE __m256i ld256(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Exact integer sum (code - 1) * q of one odd tail group (32 code bytes, planes of 32 activation bytes).
TGT_INLINE int32_t tail_group_dot(const uint8_t* codes, const int8_t* qt, int32_t qsum) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  __m256i acc = _mm256_setr_epi32(-qsum, 0, 0, 0, 0, 0, 0, 0);
  acc = dot4_planes256(acc, _mm256_and_si256(w, m3), _mm256_and_si256(_mm256_srli_epi16(w, 2), m3),
                       _mm256_and_si256(_mm256_srli_epi16(w, 4), m3), _mm256_and_si256(_mm256_srli_epi16(w, 6), m3),
                       ld256(qt), ld256(qt + 32), ld256(qt + 64), ld256(qt + 96));
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  const __m128i s2 = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(2, 3, 0, 1))));
}

// Rows of the q8 matvec walk their codes this far ahead of the loads with a software prefetch.
constexpr int64_t kStreamPrefetch = 2048;

// 1 / 254^(L-1): the unit of the combined digit dot ((I0 * 254) + I1) * 254 + I2.
constexpr float digit_unit(int L) { return L == 1 ? 1.0f : L == 2 ? 1.0f / 254 : 1.0f / 64516; }
// t * 254 + a in int32 lanes (exact: see kernels.h for the range).
TGT_INLINE __m512i times254_add(__m512i t, __m512i a) {
  return _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(t, 8), _mm512_slli_epi32(t, 1)), a);
}

// dl + 254 * acc for acc = ONE chunk's digit-0 dot of a row (the matvec's first combine). Such a lane sums 16
// products |code * q| <= 3 * 127 plus, in lanes 0 and 8, -sum(q) of a group (<= 128 * 127): |acc| <= 22352
// < 2^15, so its low int16 IS acc (the high one its sign) and one vpdpwssd against int16 pairs (254, 0) does
// the multiply-add, instead of two shifts, a subtract and an add (the matvec is ALU-bound at L >= 2).
TGT_INLINE __m512i combine_first(__m512i acc, __m512i dl) {
#if BONSAI_AVX512_VNNI
  return _mm512_dpwssd_epi32(dl, acc, _mm512_set1_epi32(254));
#else
  return times254_add(acc, dl);
#endif
}

// fp16 d of a chunk's two blocks as 16 floats [d(2c) x 8 | d(2c+1) x 8], the lanes of the chunk's two
// groups in the matvec accumulator: two broadcast loads and a blend. (A dword gather of 16 blocks' d per row
// cost ~20% of the q16 matvec on Zen 4, where gathers are slow.)
TGT_INLINE __m512 chunk_d(const uint8_t* chunk) {
  uint16_t da, db;
  std::memcpy(&da, chunk, 2);
  std::memcpy(&db, chunk + kPq2Bytes, 2);
  return _mm512_cvtph_ps(_mm256_mask_blend_epi16(0xFF00, _mm256_set1_epi16(short(da)), _mm256_set1_epi16(short(db))));
}

// R rows of the integer matvec with L activation digits: row r's blocks at w0 + r * ws bytes, its output
// y[r * ys]; q [L, K], qsum [L, G]. The codes are decoded once for all digits.
template <int R, int L>
TGT_INLINE void q8_rows_x1(const uint8_t* w0, int64_t ws, int64_t K, const int8_t* q, const float* qs,
                           const int32_t* qsum, float* y, int64_t ys) {
  const int64_t G = K / 128, C = G / 2;  // full chunks of two groups
  const __m512i idx_lo = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i two = _mm512_set1_epi32(2);
  const __m512 unit = _mm512_set1_ps(digit_unit(L));
  __m512 facc[R];
  for (int r = 0; r < R; ++r) facc[r] = _mm512_setzero_ps();
  // Blocks of 8 chunks = 16 groups: s_g of the block's groups in one vector; chunk c of the block spreads
  // lanes 2c and 2c+1 over the two 8-lane halves (vpermps with idx_lo + 2c), shared by the R rows.
  for (int64_t c0 = 0; c0 < C; c0 += 8) {
    const int64_t g0 = 2 * c0, left = G - g0, c1 = std::min<int64_t>(C, c0 + 8);
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const __m512 sv = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, qs + g0), unit);
    __m512i pidx = idx_lo;
    for (int64_t c = c0; c < c1; ++c) {
      __m512i x[L][4], ns[L];
      for (int l = 0; l < L; ++l) {
        const int8_t* qc = q + l * K + 256 * c;
        for (int t = 0; t < 4; ++t) x[l][t] = _mm512_loadu_si512(qc + 64 * t);
        ns[l] = neg_sums(qsum + l * G + 2 * c);
      }
      const __m512 s2 = _mm512_permutexvar_ps(pidx, sv);  // [s(2c) x 8 | s(2c+1) x 8] * digit unit
      for (int r = 0; r < R; ++r) {
        const uint8_t* wc = w0 + r * ws + 2 * kPq2Bytes * c;
        _mm_prefetch(reinterpret_cast<const char*>(wc + kStreamPrefetch), _MM_HINT_T0);
        const Planes pl = planes(wc);
        __m512i acc = dot4_planes(ns[0], pl.p[0], pl.p[1], pl.p[2], pl.p[3], x[0][0], x[0][1], x[0][2], x[0][3]);
        for (int l = 1; l < L; ++l) {  // exact in int32 (see kernels.h)
          const __m512i dl = dot4_planes(ns[l], pl.p[0], pl.p[1], pl.p[2], pl.p[3], x[l][0], x[l][1], x[l][2], x[l][3]);
          acc = l == 1 ? combine_first(acc, dl) : times254_add(acc, dl);
        }
        facc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(chunk_d(wc), s2), facc[r]);
      }
      pidx = _mm512_add_epi32(pidx, two);
    }
  }
  for (int r = 0; r < R; ++r) {
    float t = _mm512_reduce_add_ps(facc[r]);
    if (G & 1) {
      const int64_t g = G - 1;
      int32_t i = 0;
      const uint8_t* blk = w0 + r * ws + g * kPq2Bytes;
      for (int l = 0; l < L; ++l) i = i * 254 + tail_group_dot(pq2_block_codes(blk), q + l * K + 256 * C, qsum[l * G + g]);
      t += float(i) * (block_d(blk) * (qs[g] * digit_unit(L)));
    }
    y[r * ys] = t;
  }
}

template <int L>
TGT_INLINE void q8_x1_levels(const uint8_t* wb, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                             const float* qscale, const int32_t* qsum, float* y) {
  const int64_t rb = row_bytes(K);
  // kRuns equal runs of Q rows in lockstep (kRuns long sequential streams), then the < kRuns leftover
  // rows. Rows get identical arithmetic either way (results do not depend on how the pool cuts the range).
  // 8 rather than 4: the activation loads and the per-chunk scale/sum shuffles are shared by twice the rows
  // (q16 in L2, one core: 65.4 -> 67.6-68.6 GMAC/s; 6 runs measured no better than 4).
  constexpr int kRuns = 8;
  const int64_t Q = (n1 - n0) / kRuns;
  for (int64_t j = 0; j < Q; ++j)
    q8_rows_x1<kRuns, L>(wb + (n0 + j) * rb, Q * rb, K, q, qscale, qsum, y + j, Q);
  for (int64_t n = n0 + kRuns * Q; n < n1; ++n) q8_rows_x1<1, L>(wb + n * rb, rb, K, q, qscale, qsum, y + (n - n0), 1);
}

TGT void ternary_rows_q8_x1_avx512(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                                   const float* qscale, const int32_t* qsum, int levels, float* y) {
  if (levels == 1) q8_x1_levels<1>(blocks, K, n0, n1, q, qscale, qsum, y);
  else if (levels == 2) q8_x1_levels<2>(blocks, K, n0, n1, q, qscale, qsum, y);
  else q8_x1_levels<3>(blocks, K, n0, n1, q, qscale, qsum, y);
}

// ---- q8 GEMM, 16 rows per int32 lane set ("broadcast activation") -----------------------------------
// Above, every (m, row, chunk) pays a conversion + two multiplies for 4 vpdpbusd, because the 16 lanes of a
// chunk's accumulator hold two groups of ONE row. Here the lanes are 16 ROWS: the 64 code bytes of one
// chunk of 16 rows are loaded and transposed (16 x 16 dwords), so lane j of T[k] holds row j's code
// bytes 4k..4k+3; its plane t multiplies the activation's plane-t bytes 4k..4k+3, one dword broadcast to
// all lanes. A lane then accumulates a row's WHOLE group (8 dwords x 4 planes), and the fp32 scaling costs
// 4 ops per 32 vpdpbusd. The decoded planes (4 KB) are reused by every activation row m.

// In-place 16 x 16 transpose of 32-bit elements: a[r] lane k -> a[k] lane r.
TGT_INLINE void transpose16x16(__m512i a[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
  }
  __m512i u[16];  // u[4i + j] 128-bit lane L: rows 4i..4i+3, element 4L + j
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // 4 x 4 transpose of 128-bit lanes across u[j], u[4 + j], u[8 + j], u[12 + j]
    const __m512i s0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), s1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44), s3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    a[j] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    a[4 + j] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    a[8 + j] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    a[12 + j] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
  }
}

TGT_INLINE __m512i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
#if BONSAI_AVX512_VNNI
// acc += codes . (4 bytes at p, broadcast), for the GEMM with L activation digits. At L >= 2 the broadcast
// rides in vpdpbusd's memory operand ({1to16}, inline asm: GCC emits a separate vpbroadcastd per product
// for the intrinsic form): q16 +3% in L2 on Zen 4 (min of 5 x 3 interleaved runs, docs/cpu-kernels.md). At
// L = 1 the intrinsic form stays: the embedded form measured 1.5% slower there.
template <int L>
TGT_INLINE __m512i dpbusd_bcast(__m512i acc, __m512i codes, const int8_t* p) {
  if constexpr (L == 1) {
    return _mm512_dpbusd_epi32(acc, codes, bcast32(p));
  } else {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*reinterpret_cast<const int32_t*>(p)));
    return acc;
  }
}
#endif

// MB activation rows against the decoded planes of half h of a chunk (dwords 8h .. 8h+7 = group 2c + h),
// L digits: q points at row 0's chunk of digit 0 (digit l at + l * K, rows qrs apart), qsum at row 0's
// group of digit 0 (digit l at + l * G, rows srs apart), qs at row 0's group (rows G apart).
// facc[mb] (16 rows) += the scaled exact group dot.
// P: the activation's plane stride in this chunk (64; 32 in an odd tail chunk of one group, kernels.h).
template <int MB, int L, int P = 64>
TGT_INLINE void gemm16_half(const __m512i (*pl)[4], int h, const int8_t* q, int64_t K, int64_t qrs, const float* qs,
                            const int32_t* qsum, int64_t G, int64_t srs, __m512 d, __m512* facc) {
  __m512i tot[MB];
  for (int l = 0; l < L; ++l) {
    // Two accumulators per activation row (planes 0-1 and 2-3): 2*MB independent vpdpbusd chains.
    __m512i acc[MB][2];
    for (int mb = 0; mb < MB; ++mb) {
      acc[mb][0] = _mm512_set1_epi32(-qsum[mb * srs + l * G]);
      acc[mb][1] = _mm512_setzero_si512();
    }
    for (int k = 8 * h; k < 8 * h + 8; ++k) {
      const __m512i p0 = pl[k][0], p1 = pl[k][1], p2 = pl[k][2], p3 = pl[k][3];
      for (int mb = 0; mb < MB; ++mb) {
        const int8_t* qq = q + mb * qrs + l * K + 4 * k;
#if BONSAI_AVX512_VNNI
        acc[mb][0] = dpbusd_bcast<L>(acc[mb][0], p0, qq);
        acc[mb][1] = dpbusd_bcast<L>(acc[mb][1], p2, qq + 2 * P);
        acc[mb][0] = dpbusd_bcast<L>(acc[mb][0], p1, qq + P);
        acc[mb][1] = dpbusd_bcast<L>(acc[mb][1], p3, qq + 3 * P);
#else
        acc[mb][0] = dot4_planes(acc[mb][0], p0, p1, p2, p3, bcast32(qq), bcast32(qq + P), bcast32(qq + 2 * P),
                                 bcast32(qq + 3 * P));  // no long chain here: one vpaddd per 4 planes
#endif
      }
    }
    for (int mb = 0; mb < MB; ++mb) {
      const __m512i a = _mm512_add_epi32(acc[mb][0], acc[mb][1]);
      tot[mb] = l == 0 ? a : times254_add(tot[mb], a);  // exact (kernels.h)
    }
  }
  for (int mb = 0; mb < MB; ++mb)
    facc[mb] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[mb]), _mm512_mul_ps(d, _mm512_set1_ps(qs[mb * G] * digit_unit(L))),
                               facc[mb]);
}

// The four code planes of 16 transposed code dwords (a[k] lane r = row r's dword k), k < kn.
TGT_INLINE void decode_planes(const __m512i* a, int kn, __m512i (*pl)[4]) {
  const __m512i m3 = _mm512_set1_epi8(3);
  for (int k = 0; k < kn; ++k) {
    pl[k][0] = _mm512_and_si512(a[k], m3);
    pl[k][1] = _mm512_and_si512(_mm512_srli_epi16(a[k], 2), m3);
    pl[k][2] = _mm512_and_si512(_mm512_srli_epi16(a[k], 4), m3);
    pl[k][3] = _mm512_and_si512(_mm512_srli_epi16(a[k], 6), m3);
  }
}

// Activation rows m0 .. m0 + mc - 1 (L digits) against the decoded planes of chunk c of 16 rows: group 2c
// with the rows' d in dA and, when `groups` == 2, group 2c + 1 with dB; facc[m - m0] (16 rows) += the
// scaled group dots. P: 64, or 32 for an odd tail chunk (one group).
template <int L, int P>
TGT_INLINE void gemm16_chunk(const __m512i (*pl)[4], int groups, __m512 dA, __m512 dB, const int8_t* q, int64_t K,
                             int64_t G, int64_t c, const float* qs, const int32_t* qsum, int64_t m0, int64_t mc,
                             __m512* facc) {
  const int64_t qrs = L * K, srs = L * G;
  int64_t m = 0;
  for (; m + 4 <= mc; m += 4) {
    const int64_t mm = m0 + m;
    const int8_t* qm = q + mm * qrs + 256 * c;
    gemm16_half<4, L, P>(pl, 0, qm, K, qrs, qs + mm * G + 2 * c, qsum + mm * srs + 2 * c, G, srs, dA, facc + m);
    if (groups == 2)
      gemm16_half<4, L, P>(pl, 1, qm, K, qrs, qs + mm * G + 2 * c + 1, qsum + mm * srs + 2 * c + 1, G, srs, dB, facc + m);
  }
  for (; m < mc; ++m) {
    const int64_t mm = m0 + m;
    const int8_t* qm = q + mm * qrs + 256 * c;
    gemm16_half<1, L, P>(pl, 0, qm, K, qrs, qs + mm * G + 2 * c, qsum + mm * srs + 2 * c, G, srs, dA, facc + m);
    if (groups == 2)
      gemm16_half<1, L, P>(pl, 1, qm, K, qrs, qs + mm * G + 2 * c + 1, qsum + mm * srs + 2 * c + 1, G, srs, dB, facc + m);
  }
}

// Rows w0 .. w0 + nr - 1 (nr <= 16, rb bytes apart), all M activation rows (L digits); y[m * ldy + r]. A row
// tail (nr < 16) runs the same code with zero lanes, so every row gets bit-identical arithmetic wherever
// the thread pool cuts the row range (results must not depend on the thread count).
template <int L>
TGT void q8_rows16_xm(const uint8_t* w0, int64_t rb, int64_t K, const int8_t* q, const float* qs, const int32_t* qsum,
                      int64_t M, float* y, int64_t ldy, int nr) {
  const int64_t G = K / 128, C = G / 2, qrs = L * K, srs = L * G;
  constexpr int kMT = 64;
  alignas(64) __m512i pl[16][4];  // decoded planes of one chunk of 16 rows: [dword k][plane t], lane = row
  alignas(64) __m512 facc[kMT];   // [m] 16 rows
  const __m512i row_idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(int(rb)));  // byte offsets of the 16 rows
  for (int64_t m0 = 0; m0 < M; m0 += kMT) {
    const int64_t mc = std::min<int64_t>(kMT, M - m0);
    for (int64_t m = 0; m < mc; ++m) facc[m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; ++c) {
      __m512i a[16];
      const uint8_t* wc = w0 + 2 * kPq2Bytes * c;
      for (int r = 0; r < 16; ++r) a[r] = r < nr ? chunk_codes(wc + r * rb) : _mm512_setzero_si512();
      transpose16x16(a);
      decode_planes(a, 16, pl);
      // d of groups 2c and 2c+1 for the 16 rows: one gather per group.
      const __m512 dA = gather_d(wc, row_idx, __mmask16((1u << nr) - 1));
      const __m512 dB = gather_d(wc + kPq2Bytes, row_idx, __mmask16((1u << nr) - 1));
      gemm16_chunk<L, 64>(pl, 2, dA, dB, q, K, G, c, qs, qsum, m0, mc, facc);
    }
    for (int64_t m = 0; m < mc; ++m) {
      const int64_t mm = m0 + m;
      alignas(64) float out[16];
      _mm512_store_ps(out, facc[m]);
      if (G & 1) {  // the odd last group, row by row
        const int64_t g = G - 1;
        for (int r = 0; r < nr; ++r) {
          int32_t i = 0;
          const uint8_t* blk = w0 + r * rb + g * kPq2Bytes;
          for (int l = 0; l < L; ++l)
            i = i * 254 + tail_group_dot(pq2_block_codes(blk), q + mm * qrs + l * K + 256 * C, qsum[mm * srs + l * G + g]);
          out[r] += float(i) * (block_d(blk) * (qs[mm * G + g] * digit_unit(L)));
        }
      }
      std::memcpy(y + mm * ldy, out, sizeof(float) * size_t(nr));
    }
  }
}

TGT void ternary_rows_q8_xm_avx512(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                                   const float* qscale, const int32_t* qsum, int levels, int64_t M, float* y,
                                   int64_t ldy) {
  const int64_t rb = row_bytes(K);
  for (int64_t n = n0; n < n1; n += 16) {
    const int nr = int(std::min<int64_t>(16, n1 - n));
    const uint8_t* w = blocks + n * rb;
    if (levels == 1) q8_rows16_xm<1>(w, rb, K, q, qscale, qsum, M, y + (n - n0), ldy, nr);
    else if (levels == 2) q8_rows16_xm<2>(w, rb, K, q, qscale, qsum, M, y + (n - n0), ldy, nr);
    else q8_rows16_xm<3>(w, rb, K, q, qscale, qsum, M, y + (n - n0), ldy, nr);
  }
}

#include "backend/cpu/kernels_avx512_tiles.h"

// ---- fp32 GEMM, 16 rows per lane set ------------------------------------------------------------------
// The fp32-activation GEMM in the same broadcast form: the codes of one chunk of 16 rows are transposed,
// every element e becomes one vector w_e = ((code - 1) * d) over the 16 rows (exact in fp32; decoded once
// into an L1 tile per group and reused by every activation row m), and each activation row runs one FMA per
// element against x[m][e] broadcast: 16 multiply-adds per FMA and no per-group scaling at all.
template <int MB>
TGT_INLINE void f32_gemm16_group(const __m512* wt, const float* x, int64_t K, __m512* facc) {
  __m512 acc[MB][2];
  for (int mb = 0; mb < MB; ++mb) {
    acc[mb][0] = facc[mb];
    acc[mb][1] = _mm512_setzero_ps();
  }
  for (int e = 0; e < 128; e += 2) {
    const __m512 w0 = wt[e], w1 = wt[e + 1];
    for (int mb = 0; mb < MB; ++mb) {
      acc[mb][0] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[mb * K + e]), acc[mb][0]);
      acc[mb][1] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[mb * K + e + 1]), acc[mb][1]);
    }
  }
  for (int mb = 0; mb < MB; ++mb) facc[mb] = _mm512_add_ps(acc[mb][0], acc[mb][1]);
}

// Rows w0 .. w0 + nr - 1 (nr <= 16), all M activation rows; y[m * ldy + r]. Row tails use the same code
// with zero lanes (results independent of where the pool cuts the rows).
TGT void f32_rows16_xm(const uint8_t* w0, int64_t rb, int64_t K, const float* x, int64_t M, float* y, int64_t ldy,
                       int nr) {
  const int64_t G = K / 128;
  constexpr int kMT = 64;
  alignas(64) __m512 wt[128];    // one group: element e of the 16 rows, times d
  alignas(64) __m512 facc[kMT];  // [m] 16 rows
  const __mmask16 rows = __mmask16((1u << nr) - 1);
  const __m512i m3 = _mm512_set1_epi32(3);
  for (int64_t m0 = 0; m0 < M; m0 += kMT) {
    const int64_t mc = std::min<int64_t>(kMT, M - m0);
    for (int64_t m = 0; m < mc; ++m) facc[m] = _mm512_setzero_ps();
    for (int64_t c = 0; 2 * c < G; ++c) {
      const int groups = 2 * c + 1 < G ? 2 : 1;
      __m512i a[16];
      const uint8_t* wc = w0 + 2 * kPq2Bytes * c;
      for (int r = 0; r < 16; ++r)
        a[r] = r >= nr ? _mm512_setzero_si512()
               : groups == 2 ? chunk_codes(wc + r * rb)
                             : _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pq2_block_codes(wc + r * rb))));
      transpose16x16(a);  // a[k] lane r: row r's code dword k of the chunk (elements 16k .. 16k+15)
      for (int h = 0; h < groups; ++h) {
        const int64_t g = 2 * c + h;
        // d of group g for the 16 rows.
        alignas(64) float dr[16] = {};
        for (int r = 0; r < nr; ++r) dr[r] = block_d(w0 + r * rb + g * kPq2Bytes);
        const __m512 d = _mm512_load_ps(dr);
        for (int k = 0; k < 8; ++k)
          for (int j = 0; j < 16; ++j) {
            const __m512 code = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(a[8 * h + k], 2 * j), m3));
            wt[16 * k + j] = _mm512_fmsub_ps(code, d, d);  // (code - 1) * d, exact
          }
        int64_t m = 0;
        for (; m + 4 <= mc; m += 4) f32_gemm16_group<4>(wt, x + (m0 + m) * K + 128 * g, K, facc + m);
        for (; m < mc; ++m) f32_gemm16_group<1>(wt, x + (m0 + m) * K + 128 * g, K, facc + m);
      }
    }
    for (int64_t m = 0; m < mc; ++m) _mm512_mask_storeu_ps(y + (m0 + m) * ldy, rows, facc[m]);
  }
}

TGT void ternary_rows_xm_avx512(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, int64_t M,
                                float* y, int64_t ldy) {
  const int64_t rb = row_bytes(K);
  for (int64_t n = n0; n < n1; n += 16)
    f32_rows16_xm(blocks + n * rb, rb, K, x, M, y + (n - n0), ldy, int(std::min<int64_t>(16, n1 - n)));
}

}  // namespace
}  // namespace bonsai::cpu

#undef TGT
#undef TGT_INLINE
#pragma GCC diagnostic pop
