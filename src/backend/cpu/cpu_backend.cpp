#include "backend/cpu/cpu_backend.h"

#include <cstdlib>
#include <string_view>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "util/error.h"

namespace bonsai {

CpuBackend::CpuBackend() : CpuBackend(Options{}) {}

CpuBackend::CpuBackend(const Options& o) : opt_(o) {
  cpu::set_num_threads(o.threads);  // no-op when the pool already has that many
}

int CpuBackend::threads() const { return cpu::num_threads(); }

namespace {
bool tiles_enabled_by_env() {
  const char* e = std::getenv("BONSAI_CPU_TILES");
  return !(e && std::string_view(e) == "0");
}
}  // namespace

void CpuBackend::prepare(const Model& m) {
  // Only when the active variant can use them: a variant switched to later (tests) finds tiles it
  // cannot read ignored (the op layer checks the variant), never misread.
  // Owned buffers are released only where the tiles will serve every product: integer activations (f32 reads the
  // canonical blocks).
  if (opt_.tile_weights && tiles_enabled_by_env() && cpu::kernels().ternary_tiles_q8_x1)
    tiles_.build(m, opt_.release_owned && cpu::activation_levels(cpu::ternary_activation()) > 0);
}

void CpuBackend::embed_rows(const TernaryMatrix& table, const int32_t* host_ids, int64_t M, float* out) {
  for (int64_t m = 0; m < M; ++m)
    cpu::ternary_dequant_row(table.row_blocks(host_ids[m]), table.cols, 0, out + m * table.cols);
}

void CpuBackend::hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  cpu::hadamard_forward(x, rows, K, signs, block);
}
void CpuBackend::hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  cpu::hadamard_inverse(x, rows, K, signs, block);
}

void CpuBackend::linear(const LinearOut* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  constexpr int kMax = 8;  // a site feeds at most 3 linears; a fixed array keeps the hot path allocation-free
  if (n_outs < 1 || n_outs > kMax) fail("linear: {} outputs (1..{} supported)", n_outs, kMax);
  TernaryOut t[kMax];
  bool any_released = false;
  for (int i = 0; i < n_outs; ++i) {
    const TernaryMatrix& w = *outs[i].w;
    if (w.cols != K) fail("linear: {} has K = {}, the input has {}", w.name, w.cols, K);
    bool released = false;
    const uint8_t* tiles = tiles_.find(w, &released);
    any_released = any_released || released;
    // (A released matrix has tiles only: its blocks pointer is withheld so no path can read the returned pages.)
    t[i] = {released ? nullptr : w.blocks, w.rows, outs[i].y, w.row_runs.data(), int64_t(w.row_runs.size()), tiles};
  }
  // A product not served by the tiles alone reads the canonical blocks, which a released matrix no longer has.
  if (any_released && M > 0 && !cpu::ternary_takes_tiles(t, n_outs, M))
    for (int i = 0; i < n_outs; ++i)
      if (!t[i].blocks)
        fail("linear: {}'s canonical weights were returned to the system after tiling (CpuBackend::Options::"
             "release_owned), but this product needs them (activation precision {}, kernels {}): keep them by "
             "not setting release_owned",
             outs[i].w->name, cpu::activation_name(cpu::ternary_activation()), cpu::kernels().name);
  cpu::ternary_matmul_multi(t, n_outs, K, x, M);
}

void CpuBackend::dense_linear(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  cpu::dense_matmul_f32(w, N, K, x, M, y);
}

void CpuBackend::rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  cpu::rmsnorm(x, rows, n, gain, eps, out);
}
void CpuBackend::add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                             float* out) {
  cpu::add_rmsnorm(h, delta, rows, n, gain, eps, out);
}
void CpuBackend::l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) {
  cpu::l2norm_heads(x, rows, head_dim, eps);
}
void CpuBackend::gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                               float* out) {
  cpu::gated_rmsnorm(o, z, gain, rows, Dv, eps, out);
}

void CpuBackend::rope_neox(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t p0,
                           float theta) {
  for (int64_t m = 0; m < M; ++m) cpu::rope_neox(x + m * n_heads * head_dim, n_heads, head_dim, rot_dims, p0 + m, theta);
}

void CpuBackend::attention(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0,
                           int64_t Hq, int64_t Hkv, int64_t D, float scale, float* out) {
  if (M == 1) cpu::attention_decode(q, k_cache, v_cache, p0 + 1, Hq, Hkv, D, scale, out);
  else cpu::attention_prefill(q, k_cache, v_cache, M, p0, Hq, Hkv, D, scale, out);
}

void CpuBackend::sigmoid_gate_mul(float* x, const float* gate, int64_t n) { cpu::sigmoid_gate_mul(x, gate, n); }
void CpuBackend::silu_mul(const float* gate, const float* up, int64_t n, float* out) { cpu::silu_mul(gate, up, n, out); }

void CpuBackend::gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc,
                          float* out) {
  cpu::gdn_conv(x, conv_state, taps, T, C, Kc, out);
}
void CpuBackend::gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                           float* g, float* beta) {
  cpu::gdn_gates(a, b, A, dt_bias, T, Nv, g, beta);
}
void CpuBackend::gdn_delta_rule(float* state, const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                                float* out) {
  if (opt_.gdn_chunked && T > 1) cpu::gdn_chunked(state, q, k, v, g, beta, T, Nk, Nv, Dk, Dv, out, kGdnChunk);
  else cpu::gdn_recurrent(state, q, k, v, g, beta, T, Nk, Nv, Dk, Dv, out);
}

}  // namespace bonsai
