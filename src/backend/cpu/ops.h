// The CPU op library: the same free functions, with the SAME signatures and semantics, as the
// reference (backend/ref/ops.h), computed in fp32 with sensible accumulation (several partial sums,
// per-group scaling) and multi-threaded over rows / heads with the pool of backend/cpu/thread_pool.h.
// tests/backend checks every op against bonsai::ref with stated tolerances.
//
// Portable C++ for any x86-64 today. The hot inner loops (ternary row dot products, the FWHT of one
// block) go through the kernel table of backend/cpu/kernels.h, where AVX2 / AVX-512 variants can be
// added behind runtime CPU dispatch without touching these entry points.
//
// Threads: the global pool of thread_pool.h (default hardware_concurrency threads, caller included);
// cpu::set_num_threads(n) resizes it. Results do not depend on the thread count (tested bit for bit).
//
// Shape notation: [A, B] is a row-major buffer of A rows of B elements. "in place" buffers are read and
// overwritten. Output buffers never alias inputs unless stated. Shape misuse throws bonsai::Error;
// nothing else throws, and no op allocates per call once its per-thread scratch has grown.
#pragma once
#include <cstdint>

#include "backend/ref/op_types.h"

namespace bonsai::cpu {

// ---- Hadamard rotation (FACTS section 5) ---------------------------------------------------------
// x      fp32 [rows, K], in place
// signs  int8 [K] of +1/-1 (the sign vector of width K), or nullptr for all +1
// block  power of two, K % block == 0; each row is cut into K/block consecutive blocks
// H is the Sylvester Hadamard matrix of order `block`, H[r][c] = (-1)^popcount(r & c).
// hadamard_forward: x <- H (signs ⊙ x) / sqrt(block)       (sign first: the folded-linear side)
// hadamard_inverse: x <- signs ⊙ (H x / sqrt(block))       (transform first: the embedding side)
// The two are inverses of each other (H/sqrt(n) is symmetric and orthogonal, S^2 = I).
void hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block);
void hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block);

// ---- Ternary linear layers -----------------------------------------------------------------------
// Canonical ternary W [N, K] (K % 128 == 0):
//   blocks uint8 [N, K/128, 34]  PQ2_0 blocks: fp16 d then 32 code bytes; W[n][e] = (code - 1) * d of
//                                block e/128 of row n; code 3 -> +2d
// x fp32 [M, K]; y fp32 [M, N] = x W^T (written). M = 1 is the decode matvec.
void ternary_matmul(const uint8_t* blocks, int64_t N, int64_t K, const float* x, int64_t M, float* y);
// Several weight sets with the same K sharing one x (q+k+v, qkv+z, gate+up): outs[i].y [M, outs[i].N]
// = x W_i^T, one call. n_outs >= 1.
void ternary_matmul_multi(const TernaryOut* outs, int n_outs, int64_t K, const float* x, int64_t M);
// Whether ternary_matmul_multi serves these outputs from their tiles alone (integer activations, a kernel variant
// with tiled kernels, every output tiled, M > 0); otherwise it reads the canonical blocks.
bool ternary_takes_tiles(const TernaryOut* outs, int n_outs, int64_t M);
// Dequantise row `row` of W (for the embedding gather): out fp32 [K] = W[row][:].
void ternary_dequant_row(const uint8_t* blocks, int64_t K, int64_t row, float* out);

// Dense bf16 linear (GDN's small a/b projections): w bf16 bits [N, K]; x fp32 [M, K]; y fp32 [M, N] = x w^T.
void dense_matmul_bf16(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t M, float* y);
// Dense fp32 linear (the canonical a/b projections are fp32 [Nv, E]): w fp32 [N, K]; x fp32 [M, K];
// y fp32 [M, N] = x w^T (written).
void dense_matmul_f32(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y);

// ---- Normalisation -------------------------------------------------------------------------------
// x fp32 [rows, n]; gain fp32 [n] or nullptr (= 1); out fp32 [rows, n] (may alias x).
// out = x / sqrt(mean(x^2) + eps) * gain, per row. Per-head norms: rows = tokens * heads, n = head_dim.
void rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out);
// Residual add then norm: h fp32 [rows, n] in place h += delta (delta fp32 [rows, n]); then
// out fp32 [rows, n] = rmsnorm(h) * gain. out must not alias h or delta.
void add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps, float* out);
// x fp32 [rows, head_dim] in place: x *= 1 / sqrt(sum(x^2) + eps) per row.
void l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps = 1e-6f);
// GDN output norm: o, z fp32 [rows, Dv]; gain fp32 [Dv] (raw ssm_norm); out fp32 [rows, Dv] (may alias o).
// out = o / sqrt(mean(o^2) + eps) * gain * silu(z).
void gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                   float* out);

// ---- Positions -----------------------------------------------------------------------------------
// NEOX RoPE, in place on x fp32 [n_heads, head_dim] (one token at position pos). For i < rot_dims/2 the
// pair (x[i], x[i + rot_dims/2]) is rotated by angle = pos * theta^(-2i/rot_dims):
//   (a, b) -> (a cos - b sin, a sin + b cos). Dims >= rot_dims are untouched. rot_dims even, <= head_dim.
void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t pos, float theta);

// ---- Attention -----------------------------------------------------------------------------------
// q fp32 [Hq, D]; k_cache, v_cache fp32 [T, Hkv, D] (positions 0..T-1, all visible); out fp32 [Hq, D].
// out[h] = sum_t softmax_t(scale * q[h] . k[t][h / (Hq/Hkv)]) v[t][h / (Hq/Hkv)]. Hq % Hkv == 0, T >= 1.
void attention_decode(const float* q, const float* k_cache, const float* v_cache, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t D, float scale, float* out);
// M query rows at positions p0 .. p0+M-1 with the causal mask: q fp32 [M, Hq, D]; k_cache, v_cache fp32
// [p0 + M, Hkv, D] (the new rows already written); query row m sees positions 0 .. p0+m. out fp32 [M, Hq, D].
void attention_prefill(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0,
                       int64_t Hq, int64_t Hkv, int64_t D, float scale, float* out);

// ---- Elementwise ---------------------------------------------------------------------------------
// x, gate fp32 [n]: x *= sigmoid(gate) (in place; the attention output gate).
void sigmoid_gate_mul(float* x, const float* gate, int64_t n);
// SwiGLU: gate, up fp32 [n]; out fp32 [n] = silu(gate) * up, silu(g) = g * sigmoid(g). out may alias either.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// Index of the largest element of x fp32 [n] (n >= 1); the lowest index wins ties; NaNs never win
// (all-NaN gives 0).
int64_t argmax(const float* x, int64_t n);

// ---- Gated DeltaNet (FACTS section 6) ------------------------------------------------------------
// Causal depthwise conv + SiLU over T new tokens.
//   x          fp32 [T, C]        new inputs (the qkv channels)
//   conv_state fp32 [Kc-1, C]     the previous Kc-1 inputs, oldest row first; updated in place to the
//                                 last Kc-1 inputs (old state rows shift out when T < Kc-1)
//   taps       fp32 [C, Kc]       tap Kc-1 multiplies the current input, tap 0 the oldest
//   out        fp32 [T, C]        silu(sum_j taps[c][j] * in[t - (Kc-1) + j][c]); must not alias x
void gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc, float* out);
// a, b fp32 [T, Nv]; A, dt_bias fp32 [Nv]; g, beta fp32 [T, Nv] (outputs).
// A = -exp(A_log) (GdnWeights::A, GGUF's ssm_a: negative). beta = sigmoid(b);
// g = A * softplus(a + dt_bias)  (log decay, <= 0; softplus(x) = x for x > 20).
void gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
               float* g, float* beta);
// Token-by-token delta rule. V head h uses K head kh = h / (Nv/Nk) (grouped order); Nv % Nk == 0.
//   state fp32 [Nv, Dk, Dv]  S per V head, in place
//   q     fp32 [T, Nk, Dk]   already l2-normed and scaled by 1/sqrt(Dk)
//   k     fp32 [T, Nk, Dk]   l2-normed
//   v     fp32 [T, Nv, Dv]
//   g, beta fp32 [T, Nv]     from gdn_gates
//   out   fp32 [T, Nv, Dv]
// Per token: S = exp(g) S; kv = S^T k; delta = beta (v - kv); S += k delta^T; o = S^T q.
void gdn_recurrent(float* state, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv, float* out);
// The same recurrence evaluated chunk by chunk (chunk >= 1 tokens; the last chunk may be shorter) in the
// WY / UT form of FACTS section 6: within a chunk, Gamma = inclusive running sum of g,
// A[r][j] = beta_r e^{Gamma_r - Gamma_j} k_r.k_j (j < r), T = (I + A)^-1 by forward substitution,
// W = T diag(beta e^Gamma) K, U = T diag(beta) V, V' = U - W S0,
// O = diag(e^Gamma) Q S0 + ((Q K^T) ⊙ e^{Gamma_r - Gamma_j} for j <= r) V',
// S = e^{Gamma_L} S0 + (diag(e^{Gamma_L - Gamma}) K)^T V'. Same arguments and results as gdn_recurrent.
// CPU note: here the token-by-token form is the faster prefill (measured on a 16-core Xeon, T = 512,
// 48 heads of 128x128: gdn_recurrent 22.6 ms, gdn_chunked(64) 40.2 ms): the [Dk, Dv] state stays in L2
// either way, and the chunked form adds the O(C^2) work. The chunked form is here for parity with the
// GPU path and is tested against the recurrent one.
void gdn_chunked(float* state, const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv, float* out, int64_t chunk);

}  // namespace bonsai::cpu
