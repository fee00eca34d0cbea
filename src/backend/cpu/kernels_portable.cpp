// Portable C++ variants of the CPU inner kernels (see kernels.h). No intrinsics: 4-wide GCC/Clang vector
// extensions (plain SSE2 on x86-64, NEON elsewhere), because GCC's auto-vectoriser leaves the table-driven
// ternary dot products scalar (measured: ~2.5 cycles per weight).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/pq2_rows.h"
#include "format/ternary_codec.h"

namespace bonsai::cpu {
namespace {

typedef float v4f __attribute__((vector_size(16)));
inline v4f load4(const float* p) {
  v4f v;
  std::memcpy(&v, p, 16);
  return v;
}
inline void store4(float* p, v4f v) { std::memcpy(p, &v, 16); }
inline float hsum(v4f v) { return (v[0] + v[2]) + (v[1] + v[3]); }

static_assert(std::endian::native == std::endian::little,
              "fp16 d of a block is read little-endian; code byte b of a group holds elements 4b..4b+3");

// kCodeLut[byte][i] = (code_i - 1) for the 4 two-bit codes of a byte (element 4b+i at bits 2i).
// Decoding a byte is then one 16-byte load; 4 KiB, resident in L1.
struct CodeLut {
  alignas(64) v4f v[256];
  CodeLut() {
    for (int b = 0; b < 256; ++b)
      for (int i = 0; i < 4; ++i) v[b][i] = float(((b >> (2 * i)) & 3) - 1);
  }
};
const CodeLut kCodeLut;

float dot_portable(const float* a, const float* b, int64_t n) {
  v4f a0 = {}, a1 = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 += load4(a + i) * load4(b + i);
    a1 += load4(a + i + 4) * load4(b + i + 4);
  }
  float s = hsum(a0 + a1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void fwht_block_portable(float* x, int64_t n, const int8_t* pre_signs, const int8_t* post_signs, float scale) {
  if (pre_signs)
    for (int64_t i = 0; i < n; ++i) x[i] *= float(pre_signs[i]);
  int64_t h = 1;
  // Stages h and 2h at once (radix 4): pairs (j, j+h), (j+2h, j+3h) then (j, j+2h), (j+h, j+3h).
  // Half the loads and stores of radix 2. For h >= 4 the j loop runs 4 lanes at a time.
  for (; 4 * h <= n; h *= 4)
    for (int64_t i = 0; i < n; i += 4 * h) {
      float* p = x + i;
      if (h >= 4) {
        for (int64_t j = 0; j < h; j += 4) {
          const v4f a = load4(p + j), b = load4(p + j + h), c = load4(p + j + 2 * h), d = load4(p + j + 3 * h);
          const v4f ab = a + b, amb = a - b, cd = c + d, cmd = c - d;
          store4(p + j, ab + cd);
          store4(p + j + h, amb + cmd);
          store4(p + j + 2 * h, ab - cd);
          store4(p + j + 3 * h, amb - cmd);
        }
      } else {
        for (int64_t j = 0; j < h; ++j) {
          const float a = p[j], b = p[j + h], c = p[j + 2 * h], d = p[j + 3 * h];
          const float ab = a + b, amb = a - b, cd = c + d, cmd = c - d;
          p[j] = ab + cd;
          p[j + h] = amb + cmd;
          p[j + 2 * h] = ab - cd;
          p[j + 3 * h] = amb - cmd;
        }
      }
    }
  if (h < n)  // one radix-2 stage left when log2(n) is odd
    for (int64_t j = 0; j < h; ++j) {
      const float a = x[j], b = x[j + h];
      x[j] = a + b;
      x[j + h] = a - b;
    }
  if (post_signs)
    for (int64_t i = 0; i < n; ++i) x[i] *= float(post_signs[i]) * scale;
  else
    for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// One 128-group of one row against one x group: sum (code - 1) * x. Byte i of the group decodes to the 4
// lanes kCodeLut.v[b[i]] matching x[4i .. 4i+3]; 4 accumulators hide the add latency.
inline float group_dot(const uint8_t* b, const float* xg) {
  v4f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (int i = 0; i < 32; i += 4) {
    a0 += kCodeLut.v[b[i]] * load4(xg + 4 * i);
    a1 += kCodeLut.v[b[i + 1]] * load4(xg + 4 * i + 4);
    a2 += kCodeLut.v[b[i + 2]] * load4(xg + 4 * i + 8);
    a3 += kCodeLut.v[b[i + 3]] * load4(xg + 4 * i + 12);
  }
  return hsum((a0 + a1) + (a2 + a3));
}

void ternary_rows_x1_portable(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, float* y) {
  const int64_t G = K / 128, rb = row_bytes(K);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = blocks + n * rb;
    float total = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* blk = row + g * kPq2Bytes;
      total += group_dot(pq2_block_codes(blk), x + 128 * g) * block_d(blk);
    }
    y[n - n0] = total;
  }
}

// R weight rows (decoded to fp32, [R][128]) against one x group; each x load feeds R rows.
template <int R>
inline void tile_dot(const float (*w)[128], const float* xg, float* out) {
  v4f acc[R][2] = {};
  for (int j = 0; j < 128; j += 8) {
    const v4f x0 = load4(xg + j), x1 = load4(xg + j + 4);
    for (int r = 0; r < R; ++r) {
      acc[r][0] += load4(&w[r][j]) * x0;
      acc[r][1] += load4(&w[r][j + 4]) * x1;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r][0] + acc[r][1]);
}

template <int R>
void rows_tile_xm(const uint8_t* blocks, int64_t K, int64_t nb, const float* x, int64_t M, float* y, int64_t ldy) {
  // Decode R rows of one group once, reuse them for up to kMT activation rows; the x tile of one group
  // (kMT x 512 B) stays in L1 across the R rows.
  constexpr int kMT = 32;
  const int64_t G = K / 128;
  alignas(64) float wt[R][128];
  float d[R];
  for (int64_t m0 = 0; m0 < M; m0 += kMT) {
    const int64_t mc = std::min<int64_t>(kMT, M - m0);
    float acc[kMT][R] = {};
    for (int64_t g = 0; g < G; ++g) {
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = blocks + (nb + r) * row_bytes(K) + g * kPq2Bytes;
        const uint8_t* b = pq2_block_codes(blk);
        for (int i = 0; i < 32; ++i) store4(&wt[r][4 * i], kCodeLut.v[b[i]]);
        d[r] = block_d(blk);
      }
      for (int64_t m = 0; m < mc; ++m) {
        float s[R];
        tile_dot<R>(wt, x + (m0 + m) * K + 128 * g, s);
        for (int r = 0; r < R; ++r) acc[m][r] += s[r] * d[r];
      }
    }
    for (int64_t m = 0; m < mc; ++m)
      for (int r = 0; r < R; ++r) y[(m0 + m) * ldy + r] = acc[m][r];
  }
}

void ternary_rows_xm_portable(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, int64_t M,
                              float* y, int64_t ldy) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows_tile_xm<4>(blocks, K, n, x, M, y + (n - n0), ldy);
  for (; n < n1; ++n) rows_tile_xm<1>(blocks, K, n, x, M, y + (n - n0), ldy);
}

// ---- int8 activations (layout in kernels.h) ----

// The digit rounding every variant reproduces bit for bit: round to nearest even. |v| <= 127 (+1 ulp)
// and |r| <= 127, so adding and subtracting 1.5 * 2^23 rounds exactly like nearbyint / vroundps (and,
// unlike a libm call, lets the loops vectorise). Digits of kernels.h (base 254, no clamp needed).
inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

void quantize_q8_portable(const float* x, int64_t K, int levels, int8_t* q, float* scale, int32_t* sum) {
  const int64_t G = K / 128;
  for (int64_t g = 0; g < G; ++g) {
    const float* xg = x + 128 * g;
    float amax = 0.0f;
    for (int e = 0; e < 128; ++e) amax = std::max(amax, std::fabs(xg[e]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[g] = amax / 127.0f;
    int8_t nat[3][128];  // digits in natural order
    for (int e = 0; e < 128; ++e) {
      float v = xg[e] * inv;
      if (!(v == v)) v = 0.0f;  // NaN: digits 0 (int8_t(NaN) would be undefined)
      const float d0 = round_even(v);
      const float r1 = (v - d0) * 254.0f;
      const float d1 = round_even(r1);
      nat[0][e] = int8_t(d0);
      nat[1][e] = int8_t(d1);
      nat[2][e] = int8_t(round_even((r1 - d1) * 254.0f));
    }
// Natural element 4p + t of the chunk -> plane t, byte p (layout in kernels.h).
    const int64_t base = 256 * (g / 2), P = (g / 2 * 2 + 1 < G) ? 64 : 32, p0 = (g & 1) * 32;
    for (int l = 0; l < levels; ++l) {
      int32_t s = 0;
      for (int e = 0; e < 128; ++e) s += nat[l][e];
      sum[l * G + g] = s;
      for (int t = 0; t < 4; ++t)
        for (int p = 0; p < 32; ++p) q[l * K + base + t * P + p0 + p] = nat[l][4 * p + t];
    }
  }
}

// Exact integer sum (code - 1) * q of one group: 32 code bytes against the group's 4 planes (stride P).
inline int32_t q8_group_dot(const uint8_t* cb, const int8_t* q0, int64_t P) {
  int32_t s = 0;
  for (int p = 0; p < 32; ++p) {  // a plain reduction: GCC vectorises it
    const int b = cb[p];
    s += (b & 3) * q0[p] + ((b >> 2) & 3) * q0[P + p] + ((b >> 4) & 3) * q0[2 * P + p] + (b >> 6) * q0[3 * P + p];
  }
  return s;
}

// y = sum_g float(I_g) * (d_g * s_g * 254^-(L-1)), I_g = ((I0 * 254) + I1) * 254 + I2 of the group (each
// digit's exact dot minus its sum), groups in order, one fma each.
// row: one row of blocks [K/128, 34].
float q8_row_dot(const uint8_t* row, int64_t K, const int8_t* q, const float* qs, const int32_t* qsum, int levels) {
  const int64_t G = K / 128;
  const float unit = levels == 1 ? 1.0f : levels == 2 ? 1.0f / 254 : 1.0f / 64516;
  float total = 0.0f;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t c = g / 2, P = (2 * c + 1 < G) ? 64 : 32, off = 256 * c + (g & 1) * 32;
    const uint8_t* blk = row + g * kPq2Bytes;
    int32_t i = 0;
    for (int l = 0; l < levels; ++l) i = i * 254 + (q8_group_dot(pq2_block_codes(blk), q + l * K + off, P) - qsum[l * G + g]);
    total = std::fma(float(i), block_d(blk) * qs[g] * unit, total);
  }
  return total;
}

void ternary_rows_q8_x1_portable(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                                 const float* qscale, const int32_t* qsum, int levels, float* y) {
  for (int64_t n = n0; n < n1; ++n) y[n - n0] = q8_row_dot(blocks + n * row_bytes(K), K, q, qscale, qsum, levels);
}

void ternary_rows_q8_xm_portable(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                                 const float* qscale, const int32_t* qsum, int levels, int64_t M, float* y, int64_t ldy) {
  const int64_t G = K / 128;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m)
      y[m * ldy + (n - n0)] = q8_row_dot(blocks + n * row_bytes(K), K, q + m * levels * K, qscale + m * G,
                                         qsum + m * levels * G, levels);
}

const Kernels kPortable{"portable",           fwht_block_portable,        ternary_rows_x1_portable,
                        ternary_rows_xm_portable, dot_portable,           quantize_q8_portable,
                        ternary_rows_q8_x1_portable, ternary_rows_q8_xm_portable};

}  // namespace

const Kernels& portable_kernels() { return kPortable; }

}  // namespace bonsai::cpu
