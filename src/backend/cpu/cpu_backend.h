// CpuBackend: the Backend interface over the CPU op library (backend/cpu/ops.h): fp32, threaded over
// the global pool of backend/cpu/thread_pool.h. prepare() re-tiles the ternary linears for the integer
// kernels when the active kernel variant has tiled kernels (backend/cpu/tiles.h, weight_tiles.h; off with
// Options::tile_weights = false or BONSAI_CPU_TILES=0); every other path reads the canonical blocks.
//
// Evaluation choices: attention M == 1 -> attention_decode, else attention_prefill; the delta rule is
// token by token (gdn_recurrent) for any T by default: measured faster than the chunked form on CPU
// (backend/cpu/ops.h, gdn_chunked). Options::gdn_chunked switches prefill (T > 1) to the chunked form
// (chunk 64), for parity tests of the two paths on this backend.
#pragma once
#include "backend/cpu/site.h"
#include "backend/cpu/weight_tiles.h"
#include "backend/host_backend.h"

namespace bonsai {

class CpuBackend final : public HostBackend {
 public:
  struct Options {
    int threads = 0;           // <= 0: hardware_concurrency (resizes the process-wide CPU pool)
    bool gdn_chunked = false;  // prefill chunks through gdn_chunked instead of gdn_recurrent
    bool tile_weights = true;  // prepare() builds the tiled copies (BONSAI_CPU_TILES=0 also turns it off)
    bool release_owned = false;  // this backend is the model's only user: prepare() returns each transcoded (owned)
                                 // canonical buffer once its tiles are built (weight_tiles.h; PTQ1_0 / MLX packs hold
                                 // ~1x the weights instead of 2x); a product that would need them is refused
  };
  static constexpr int64_t kGdnChunk = 64;

  CpuBackend();
  explicit CpuBackend(const Options& o);
  const char* name() const override { return "cpu"; }
  int threads() const;
  void prepare(const Model& m) override;
  const cpu::WeightTiles& weight_tiles() const { return tiles_; }  // what prepare() tiled, its bytes and time

  void embed_rows(const TernaryMatrix& table, const int32_t* host_ids, int64_t M, float* out) override;
  void hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) override;
  void hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) override;
  void linear(const LinearOut* outs, int n_outs, int64_t K, const float* x, int64_t M) override;
  void dense_linear(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) override;
  void rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) override;
  void add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                   float* out) override;
  void l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) override;
  void gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                     float* out) override;
  void rope_neox(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t p0,
                 float theta) override;
  void attention(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0, int64_t Hq,
                 int64_t Hkv, int64_t D, float scale, float* out) override;
  void sigmoid_gate_mul(float* x, const float* gate, int64_t n) override;
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override;
  // Fused sites (backend/cpu/site.h): one pass per row instead of norm, copy and rotate.
  void add_rmsnorm_rotate(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                          float* out, float* site, const int8_t* signs, int64_t block) override {
    cpu::add_rmsnorm_rotate(h, delta, rows, n, gain, eps, out, site, signs, block);
  }
  void silu_mul_rotate(const float* gate, const float* up, int64_t rows, int64_t n, float* site, const int8_t* signs,
                       int64_t block) override {
    cpu::silu_mul_rotate(gate, up, rows, n, site, signs, block);
  }
  void gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc,
                float* out) override;
  void gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                 float* g, float* beta) override;
  void gdn_delta_rule(float* state, const float* q, const float* k, const float* v, const float* g,
                      const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                      float* out) override;

 private:
  Options opt_;
  cpu::WeightTiles tiles_;
};

}  // namespace bonsai
