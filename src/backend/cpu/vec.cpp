// The SIMD loops of vec.h: one body per op, written with GCC vector extensions over W floats, instantiated
// inside functions that carry the target attribute of their width (the always_inline bodies take the
// caller's ISA), and picked per call from the kernel table's variant.
#include "backend/cpu/vec.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"

// The 32- and 64-byte vector helpers are always_inline into functions of their own target: the psABI
// note about passing them without AVX enabled does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace bonsai::cpu::vec {
namespace {

#define ALWAYS_INLINE inline __attribute__((always_inline))

// The vector types per width (GCC ignores a template-dependent vector_size, hence the specialisations).
template <int W>
struct VT;
template <>
struct VT<4> {
  typedef float f __attribute__((vector_size(16)));
  typedef int32_t i __attribute__((vector_size(16)));
};
template <>
struct VT<8> {
  typedef float f __attribute__((vector_size(32)));
  typedef int32_t i __attribute__((vector_size(32)));
};
template <>
struct VT<16> {
  typedef float f __attribute__((vector_size(64)));
  typedef int32_t i __attribute__((vector_size(64)));
};

template <int W>
struct V {
  using f = typename VT<W>::f;
  using i = typename VT<W>::i;
  static ALWAYS_INLINE f load(const float* p) {
    f v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static ALWAYS_INLINE void store(float* p, const f& v) { std::memcpy(p, &v, sizeof v); }
  static ALWAYS_INLINE f splat(float a) { return f{} + a; }
  static ALWAYS_INLINE float hsum(const f& v) {
    float s = 0.0f;
    for (int j = 0; j < W; ++j) s += v[j];
    return s;
  }
};

// exp(x - n ln 2) for the rounded n: the reduction and the degree-7 Taylor polynomial, shared by the
// vector exp and its scalar tail (T = float or a vector of floats; the same operations in the same order,
// so a result does not depend on which of the two computed it). c7 = 1/5040 in T.
template <class T>
ALWAYS_INLINE T exp_reduced(const T& x, const T& n, const T& c7) {
  const T r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;  // ln 2 = hi + lo, hi exact in 11 bits
  T p = c7;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p;
}

// exp (see vec.h). Round to nearest with the 1.5 * 2^23 trick: the low mantissa bits of t hold n.
template <int W>
ALWAYS_INLINE typename V<W>::f vexp(const typename V<W>::f& x_in) {  // by reference: no vector-ABI question
  using F = typename V<W>::f;
  using I = typename V<W>::i;
  const F hi = V<W>::splat(88.3f), lo = V<W>::splat(-87.3f);
  F x = x_in > hi ? hi : x_in;
  x = x < lo ? lo : x;
  const F magic = V<W>::splat(12582912.0f);
  const F t = x * 1.44269504088896341f + magic;
  const F p = exp_reduced(x, t - magic, V<W>::splat(1.0f / 5040));
  const I e = ((I)t - (I)magic + 127) << 23;  // 2^n as float bits (n in [-126, 128))
  return p * (F)e;
}

// Scalar tail with the same formula (so a result does not depend on where the vector loop stops).
ALWAYS_INLINE float sexp(float x) {
  x = x > 88.3f ? 88.3f : x;
  x = x < -87.3f ? -87.3f : x;
  const float magic = 12582912.0f;
  const float t = x * 1.44269504088896341f + magic;
  const float p = exp_reduced(x, t - magic, 1.0f / 5040);
  int32_t ti, mi;
  std::memcpy(&ti, &t, 4);
  std::memcpy(&mi, &magic, 4);
  const int32_t e = (ti - mi + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  return p * scale;
}

template <int W>
ALWAYS_INLINE void silu_mul_w(const float* gate, const float* up, int64_t n, float* out) {
  using F = typename V<W>::f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const F g = V<W>::load(gate + i);
    V<W>::store(out + i, g / (1.0f + vexp<W>(-g)) * V<W>::load(up + i));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + sexp(-gate[i])) * up[i];
}

template <int W>
ALWAYS_INLINE void sigmoid_mul_w(float* x, const float* gate, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) V<W>::store(x + i, V<W>::load(x + i) / (1.0f + vexp<W>(-V<W>::load(gate + i))));
  for (; i < n; ++i) x[i] = x[i] / (1.0f + sexp(-gate[i]));
}

template <int W>
ALWAYS_INLINE void silu_w(float* x, int64_t n) {
  using F = typename V<W>::f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const F g = V<W>::load(x + i);
    V<W>::store(x + i, g / (1.0f + vexp<W>(-g)));
  }
  for (; i < n; ++i) x[i] = x[i] / (1.0f + sexp(-x[i]));
}

template <int W>
ALWAYS_INLINE float exp_shift_sum_w(float* x, int64_t n, float shift) {
  using F = typename V<W>::f;
  F acc{};
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const F e = vexp<W>(V<W>::load(x + i) - shift);
    V<W>::store(x + i, e);
    acc += e;
  }
  float s = V<W>::hsum(acc);
  for (; i < n; ++i) s += (x[i] = sexp(x[i] - shift));
  return s;
}

template <int W>
ALWAYS_INLINE void axpy_w(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) V<W>::store(y + i, V<W>::load(y + i) + a * V<W>::load(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}

// Columns [j0, j0 + B*W) of one head's step, B vectors of accumulators kept in registers over the Dk rows.
template <int W, int B>
ALWAYS_INLINE void gdn_cols(float* S, const float* q, const float* k, const float* v, float eg, float beta,
                            int64_t Dk, int64_t Dv, int64_t j0, float* out) {
  using F = typename V<W>::f;
  F kv[B] = {}, d[B], o[B] = {};
  for (int64_t i = 0; i < Dk; ++i) {  // pass 1: kv = S^T k
    const float* Si = S + i * Dv + j0;
    for (int b = 0; b < B; b += 16 / W) __builtin_prefetch(Si + 4 * Dv + b * W);  // 4 rows ahead, each line
    for (int b = 0; b < B; ++b) kv[b] += k[i] * V<W>::load(Si + b * W);
  }
  for (int b = 0; b < B; ++b) d[b] = beta * (V<W>::load(v + j0 + b * W) - eg * kv[b]);
  for (int64_t i = 0; i < Dk; ++i) {  // pass 2: S = eg S + k delta^T (rows now in L1/L2), out = S^T q
    float* Si = S + i * Dv + j0;
    for (int b = 0; b < B; ++b) {
      const F s = eg * V<W>::load(Si + b * W) + k[i] * d[b];
      V<W>::store(Si + b * W, s);
      o[b] += q[i] * s;
    }
  }
  for (int b = 0; b < B; ++b) V<W>::store(out + j0 + b * W, o[b]);
}

template <int W>
ALWAYS_INLINE void gdn_step_head_w(float* S, const float* q, const float* k, const float* v, float eg, float beta,
                                   int64_t Dk, int64_t Dv, float* out, float* scratch) {
  int64_t j0 = 0;
  // Column blocks of B vectors, B kv + B delta + B out accumulators in registers: at W = 16, B = 8 covers a
  // whole 128-float row (24 of the 32 zmm), so each pass is one sequential sweep of S.
  constexpr int B = W == 16 ? 8 : 4;
  for (; j0 + B * W <= Dv; j0 += B * W) gdn_cols<W, B>(S, q, k, v, eg, beta, Dk, Dv, j0, out);
  for (; j0 + W <= Dv; j0 += W) gdn_cols<W, 1>(S, q, k, v, eg, beta, Dk, Dv, j0, out);
  if (j0 == Dv) return;
  // Column tail (odd Dv), scalar, in the same order of operations.
  float* kv = scratch;
  float* d = scratch + Dv;
  for (int64_t j = j0; j < Dv; ++j) kv[j] = 0.0f;
  for (int64_t i = 0; i < Dk; ++i)
    for (int64_t j = j0; j < Dv; ++j) kv[j] += k[i] * S[i * Dv + j];
  for (int64_t j = j0; j < Dv; ++j) {
    d[j] = beta * (v[j] - eg * kv[j]);
    out[j] = 0.0f;
  }
  for (int64_t i = 0; i < Dk; ++i)
    for (int64_t j = j0; j < Dv; ++j) {
      const float s = eg * S[i * Dv + j] + k[i] * d[j];
      S[i * Dv + j] = s;
      out[j] += q[i] * s;
    }
}

template <int W>
ALWAYS_INLINE float dot_w(const float* a, const float* b, int64_t n) {
  using F = typename V<W>::f;
  F s0{}, s1{};
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    s0 += V<W>::load(a + i) * V<W>::load(b + i);
    s1 += V<W>::load(a + i + W) * V<W>::load(b + i + W);
  }
  for (; i + W <= n; i += W) s0 += V<W>::load(a + i) * V<W>::load(b + i);
  float t = V<W>::hsum(s0 + s1);
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

// Heads h0 .. h0 + nh - 1 (nh <= 6) of one KV head over `len` positions: o[h] += sum_t p[h][t] v_t. Columns
// in blocks of 2 vectors: 2 * nh accumulators stay in registers over all positions, so each V row block is
// loaded once for the nh heads (instead of one L1 round trip of o per head and position).
template <int W, int NH>
ALWAYS_INLINE void pv_heads(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t len, int64_t D,
                            float* o) {
  using F = typename V<W>::f;
  int64_t d = 0;
  for (; d + 2 * W <= D; d += 2 * W) {
    F acc[NH][2] = {};
    for (int64_t t = 0; t < len; ++t) {
      const F v0 = V<W>::load(v + t * ldv + d), v1 = V<W>::load(v + t * ldv + d + W);
      for (int h = 0; h < NH; ++h) {
        const float ph = p[h * ldp + t];
        acc[h][0] += ph * v0;
        acc[h][1] += ph * v1;
      }
    }
    for (int h = 0; h < NH; ++h) {
      V<W>::store(o + h * D + d, V<W>::load(o + h * D + d) + acc[h][0]);
      V<W>::store(o + h * D + d + W, V<W>::load(o + h * D + d + W) + acc[h][1]);
    }
  }
  for (; d < D; ++d)  // odd D: scalar columns
    for (int h = 0; h < NH; ++h) {
      float a = 0.0f;
      for (int64_t t = 0; t < len; ++t) a += p[h * ldp + t] * v[t * ldv + d];
      o[h * D + d] += a;
    }
}

template <int W>
ALWAYS_INLINE void attend_span_w(const float* q, const float* k, const float* v, int64_t len, int64_t Hq,
                                 int64_t Hkv, int64_t D, float scale, float* s, int64_t lds, float* m, float* l,
                                 float* o) {
  const int64_t rep = Hq / Hkv, row = Hkv * D;
  for (int64_t t = 0; t < len; ++t)  // scores: position t's K row (all KV heads) is one contiguous read
    for (int64_t h = 0; h < Hq; ++h) s[h * lds + t] = dot_w<W>(q + h * D, k + t * row + (h / rep) * D, D) * scale;
  for (int64_t h = 0; h < Hq; ++h) {
    float* sh = s + h * lds;
    float mx = sh[0];
    for (int64_t t = 1; t < len; ++t) mx = sh[t] > mx ? sh[t] : mx;
    m[h] = mx;
    l[h] = exp_shift_sum_w<W>(sh, len, mx);
    for (int64_t d = 0; d < D; ++d) o[h * D + d] = 0.0f;
  }
  for (int64_t kvh = 0; kvh < Hkv; ++kvh)
    for (int64_t r0 = 0; r0 < rep; r0 += 6) {
      const int64_t h0 = kvh * rep + r0, nh = rep - r0 < 6 ? rep - r0 : 6;
      const float* pv = s + h0 * lds;
      const float* vk = v + kvh * D;
      float* oh = o + h0 * D;
      switch (nh) {
        case 6: pv_heads<W, 6>(pv, lds, vk, row, len, D, oh); break;
        case 5: pv_heads<W, 5>(pv, lds, vk, row, len, D, oh); break;
        case 4: pv_heads<W, 4>(pv, lds, vk, row, len, D, oh); break;
        case 3: pv_heads<W, 3>(pv, lds, vk, row, len, D, oh); break;
        case 2: pv_heads<W, 2>(pv, lds, vk, row, len, D, oh); break;
        default: pv_heads<W, 1>(pv, lds, vk, row, len, D, oh); break;
      }
    }
}

#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define TGT256 __attribute__((target("avx2,fma")))

// Three entry points per op: AVX-512 (16), AVX2 (8), baseline (4).
#define VEC_OP(ret, name, params, args)                     \
  TGT512 ret name##_512 params { return name##_w<16> args; } \
  TGT256 ret name##_256 params { return name##_w<8> args; }  \
  ret name##_128 params { return name##_w<4> args; }

VEC_OP(void, silu_mul, (const float* gate, const float* up, int64_t n, float* out), (gate, up, n, out))
VEC_OP(void, sigmoid_mul, (float* x, const float* gate, int64_t n), (x, gate, n))
VEC_OP(void, silu, (float* x, int64_t n), (x, n))
VEC_OP(float, exp_shift_sum, (float* x, int64_t n, float shift), (x, n, shift))
VEC_OP(void, axpy, (float a, const float* x, float* y, int64_t n), (a, x, y, n))
VEC_OP(void, attend_span,
       (const float* q, const float* k, const float* v, int64_t len, int64_t Hq, int64_t Hkv, int64_t D, float scale,
        float* s, int64_t lds, float* m, float* l, float* o),
       (q, k, v, len, Hq, Hkv, D, scale, s, lds, m, l, o))
VEC_OP(void, gdn_step_head,
       (float* S, const float* q, const float* k, const float* v, float eg, float beta, int64_t Dk, int64_t Dv,
        float* out, float* scratch),
       (S, q, k, v, eg, beta, Dk, Dv, out, scratch))

// 2: AVX-512, 1: AVX2, 0: baseline; from the active kernel variant's name.
int width_class() {
  const char* n = kernels().name;
  if (!std::strncmp(n, "avx512", 6)) return 2;
  if (!std::strcmp(n, "avx2")) return 1;
  return 0;
}

}  // namespace

#define VEC_DISPATCH(name, args) \
  switch (width_class()) {       \
    case 2: return name##_512 args; \
    case 1: return name##_256 args; \
    default: return name##_128 args; \
  }

void silu_mul(const float* gate, const float* up, int64_t n, float* out) { VEC_DISPATCH(silu_mul, (gate, up, n, out)) }
void sigmoid_mul(float* x, const float* gate, int64_t n) { VEC_DISPATCH(sigmoid_mul, (x, gate, n)) }
void silu(float* x, int64_t n) { VEC_DISPATCH(silu, (x, n)) }
float exp_shift_sum(float* x, int64_t n, float shift) { VEC_DISPATCH(exp_shift_sum, (x, n, shift)) }
void axpy(float a, const float* x, float* y, int64_t n) { VEC_DISPATCH(axpy, (a, x, y, n)) }
void gdn_step_head(float* S, const float* q, const float* k, const float* v, float eg, float beta, int64_t Dk,
                   int64_t Dv, float* out, float* scratch) {
  VEC_DISPATCH(gdn_step_head, (S, q, k, v, eg, beta, Dk, Dv, out, scratch))
}

void attend_span(const float* q, const float* k, const float* v, int64_t len, int64_t Hq, int64_t Hkv, int64_t D,
                 float scale, float* s, int64_t lds, float* m, float* l, float* o) {
  VEC_DISPATCH(attend_span, (q, k, v, len, Hq, Hkv, D, scale, s, lds, m, l, o))
}

}  // namespace bonsai::cpu::vec
