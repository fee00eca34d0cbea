#include "backend/ref/ref_backend.h"

#include <vector>

#include "backend/ref/ops.h"
#include "util/error.h"

namespace bonsai {

void RefBackend::prepare(const Model&) {}  // uses the canonical buffers as they are

void RefBackend::embed_rows(const TernaryMatrix& table, const int32_t* host_ids, int64_t M, float* out) {
  for (int64_t m = 0; m < M; ++m)
    ref::ternary_dequant_row(table.row_blocks(host_ids[m]), table.cols, 0, out + m * table.cols);
}

void RefBackend::hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  ref::hadamard_forward(x, rows, K, signs, block);
}
void RefBackend::hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  ref::hadamard_inverse(x, rows, K, signs, block);
}

void RefBackend::linear(const LinearOut* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  std::vector<TernaryOut> t(static_cast<size_t>(n_outs));
  for (int i = 0; i < n_outs; ++i) {
    const TernaryMatrix& w = *outs[i].w;
    if (w.cols != K) fail("linear: {} has K = {}, the input has {}", w.name, w.cols, K);
    t[size_t(i)] = {w.blocks, w.rows, outs[i].y, w.row_runs.data(), int64_t(w.row_runs.size())};
  }
  ref::ternary_matmul_multi(t.data(), n_outs, K, x, M);
}

void RefBackend::dense_linear(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  ref::dense_matmul_f32(w, N, K, x, M, y);
}

void RefBackend::rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  ref::rmsnorm(x, rows, n, gain, eps, out);
}
void RefBackend::add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                             float* out) {
  ref::add_rmsnorm(h, delta, rows, n, gain, eps, out);
}
void RefBackend::l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) {
  ref::l2norm_heads(x, rows, head_dim, eps);
}
void RefBackend::gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                               float* out) {
  ref::gated_rmsnorm(o, z, gain, rows, Dv, eps, out);
}

void RefBackend::rope_neox(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t p0,
                           float theta) {
  for (int64_t m = 0; m < M; ++m) ref::rope_neox(x + m * n_heads * head_dim, n_heads, head_dim, rot_dims, p0 + m, theta);
}

void RefBackend::attention(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0,
                           int64_t Hq, int64_t Hkv, int64_t D, float scale, float* out) {
  if (M == 1) ref::attention_decode(q, k_cache, v_cache, p0 + 1, Hq, Hkv, D, scale, out);
  else ref::attention_prefill(q, k_cache, v_cache, M, p0, Hq, Hkv, D, scale, out);
}

void RefBackend::sigmoid_gate_mul(float* x, const float* gate, int64_t n) { ref::sigmoid_gate_mul(x, gate, n); }
void RefBackend::silu_mul(const float* gate, const float* up, int64_t n, float* out) { ref::silu_mul(gate, up, n, out); }

void RefBackend::gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc,
                          float* out) {
  ref::gdn_conv(x, conv_state, taps, T, C, Kc, out);
}
void RefBackend::gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                           float* g, float* beta) {
  ref::gdn_gates(a, b, A, dt_bias, T, Nv, g, beta);
}
void RefBackend::gdn_delta_rule(float* state, const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                                float* out) {
  if (T == 1) ref::gdn_recurrent(state, q, k, v, g, beta, T, Nk, Nv, Dk, Dv, out);
  else ref::gdn_chunked(state, q, k, v, g, beta, T, Nk, Nv, Dk, Dv, out, kGdnChunk);
}

}  // namespace bonsai
