// SIMD loops of the CPU backend outside the ternary kernel table: SiLU / sigmoid (a vector exp), the
// delta-rule step of one GDN head, and the pieces of softmax attention. Written once with GCC vector
// extensions (vec.cpp) and compiled for three widths: 16 floats under an AVX-512 target attribute, 8 under
// AVX2+FMA, 4 for baseline x86-64. The width follows the kernel table's variant (kernels().name), so
// BONSAI_CPU_KERNELS / set_kernels() force these paths too and the tests cover each one.
//
// exp: 2^n * p(r) with n = round(x log2 e), r = x - n ln 2 (two-part ln 2), p the degree-7 Taylor
// polynomial (|r| <= 0.347: truncation < 2e-8 relative); x clamped to [-87.3, 88.3] (no overflow, no
// denormals). Max relative error ~2 ulp against std::exp on that range.
#pragma once
#include <cstdint>

namespace bonsai::cpu::vec {

// out fp32 [n] = silu(gate) * up, silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// x fp32 [n] *= sigmoid(gate) (gate fp32 [n]).
void sigmoid_mul(float* x, const float* gate, int64_t n);
// x fp32 [n] = silu(x).
void silu(float* x, int64_t n);
// x fp32 [n] = exp(x - shift); returns the sum of the results (softmax numerators).
float exp_shift_sum(float* x, int64_t n, float shift);
// y fp32 [n] += a * x (x fp32 [n]).
void axpy(float a, const float* x, float* y, int64_t n);

// One token of the delta rule for one V head (FACTS section 6):
//   S fp32 [Dk, Dv] in place;  q, k fp32 [Dk];  v, out fp32 [Dv];  eg = exp(g);  beta.
//   kv = S^T k;  delta = beta (v - eg kv);  S = eg S + k delta^T;  out = S^T q.
// Two passes over S: the first streams it (from memory), the second finds it in L2 (64 KB at 128 x 128).
// scratch fp32 [2 Dv] (kv, delta).
void gdn_step_head(float* S, const float* q, const float* k, const float* v, float eg, float beta, int64_t Dk,
                   int64_t Dv, float* out, float* scratch);

// One span of `len` positions of decode attention, all heads (GQA: q head h reads KV head h / (Hq / Hkv)):
//   q fp32 [Hq, D];  k, v fp32 [len, Hkv, D] (the span's cache rows);  s fp32 [Hq, lds] scratch (lds >= len).
//   m, l fp32 [Hq]: the max scaled score and sum_t e^{score - m};  o fp32 [Hq, D] = sum_t e^{score - m} v_t.
void attend_span(const float* q, const float* k, const float* v, int64_t len, int64_t Hq, int64_t Hkv, int64_t D,
                 float scale, float* s, int64_t lds, float* m, float* l, float* o);

}  // namespace bonsai::cpu::vec
