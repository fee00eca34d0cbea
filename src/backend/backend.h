// The backend interface: the one thing the hybrid forward (model/forward.h) is written against.
//
// A backend is a set of ops on fp32 activation buffers plus a memory model. The forward never touches an
// element itself: every read or write of an activation, a KV cache or a recurrent state goes through a
// method here, so a backend whose memory is not the host's (CUDA: weights, activations, KV cache and
// states on the device) runs the same forward unchanged.
//
// Rules every implementation follows:
// - prepare(model) is called once, before any op that names a weight of that model. A backend may keep
//   its own copy of the weights there (a device upload, a repack into tiles or interleaved words for its
//   SIMD kernels). Every op argument that points into the canonical Model (a TernaryMatrix, a norm gain,
//   a sign vector, conv taps, input_perm, ...) is passed as the canonical object's own address; a backend
//   that keeps copies finds its copy by that address. RefBackend and CpuBackend use the canonical
//   buffers directly.
// - Activation / state pointers (float*) are memory this backend allocated (Buffer below). Pointers
//   named `host` are ordinary host memory.
// - Shapes: [A, B] is row-major, contiguous. An op's output never aliases its inputs unless stated.
// - Ops may throw bonsai::Error only on shape misuse (a bug, not a user error); none allocates per call
//   once warmed up (ref excepted: it is the slow truth, not a hot path).
// - Several sequences are stepped in one forward (the "batched decode" ops at the end): everything per
//   sequence (positions, the KV cache, conv and recurrent state) is an argument, never backend state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "model/weights.h"

namespace bonsai {

// One output of Backend::linear: y [M, w->rows] = x w^T (written, not accumulated).
struct LinearOut {
  const TernaryMatrix* w;
  float* y;
};

// The attention prologue of a chunk (one sequence, positions p0 .. p0 + M - 1, one KV cache) or of a batched
// step (row m of its own sequence at pos[m], its own caches k_caches[m] / v_caches[m]; pos, k_caches and
// v_caches are host arrays of M). See Backend::attention_prep.
struct AttnPrep {
  const float* q_gate;  // fp32 [M, H, 2 Dh]: per head Dh query | Dh gate
  float* q;             // fp32 [M, H, Dh] out: rope(rmsnorm(query) * q_gain)
  float* gate;          // fp32 [M, H, Dh] out
  float* k;             // fp32 [M, Hkv, Dh] in (its contents after the call are unspecified)
  const float* v;       // fp32 [M, Hkv, Dh]
  const float* q_gain;  // fp32 [Dh]
  const float* k_gain;  // fp32 [Dh]
  int64_t M, H, Hkv, Dh, rot_dims;
  float eps, theta;
  // One sequence: caches fp32 [capacity, Hkv, Dh], rows p0 .. p0 + M - 1 written.
  int64_t p0 = 0;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  // Batched (pos non-null): row pos[m] of k_caches[m] / v_caches[m].
  const int64_t* pos = nullptr;
  float* const* k_caches = nullptr;
  float* const* v_caches = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The prefill chunk (rows per forward) this backend runs best: the Decoder's default max_chunk and the
  // Session's default largest chunk. The CPU's GEMM gains nothing past 64 rows; a GPU's tensor-core GEMM
  // reuses each weight tile over more tokens.
  virtual int64_t prefill_chunk() const { return 64; }

  // ---- lifetime -----------------------------------------------------------------------------------
  // Once per model, before any op on its weights. Throws bonsai::Error for a model it cannot run.
  virtual void prepare(const Model& m) = 0;

  // ---- memory -------------------------------------------------------------------------------------
  virtual float* allocate(size_t n) = 0;                  // fp32 [n], zero-filled
  virtual void release(float* p) noexcept = 0;
  virtual void zero(float* x, size_t n) = 0;
  virtual void copy_to_host(const float* src, size_t n, float* host) = 0;
  virtual void copy_from_host(const float* host, size_t n, float* dst) = 0;
  // dst rows ld_dst apart, src rows ld_src apart: dst[r][0..cols) = src[r][0..cols) for r < rows.
  // The splits (q | gate per head, q | k | v of the GDN conv output) and the KV cache writes.
  virtual void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) = 0;
  // x fp32 [n] *= s.
  virtual void scale(float* x, size_t n, float s) = 0;

  // ---- embedding ----------------------------------------------------------------------------------
  // out fp32 [M, table.cols] = de-quantised rows ids[0..M) of the table; ids int32 [M] on the host,
  // already checked to be in [0, table.rows).
  virtual void embed_rows(const TernaryMatrix& table, const int32_t* host_ids, int64_t M, float* out) = 0;

  // ---- Hadamard rotation (FACTS section 5; ops.h of ref has the exact definitions) ----------------
  // x fp32 [rows, K] in place; signs int8 [K] (+-1, the model's vector of width K) or nullptr.
  virtual void hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) = 0;
  virtual void hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) = 0;
  // out fp32 [rows, K]: out[r][i] = x[r][perm[i]] (TernaryMatrix::input_perm, int32 [K]).
  virtual void permute_cols(const float* x, int64_t rows, int64_t K, const int32_t* perm, float* out) = 0;

  // ---- linear layers ------------------------------------------------------------------------------
  // Ternary: every outs[i].w has cols == K; x fp32 [M, K] (already rotated when the weights are folded:
  // the op never transforms). Several outputs sharing one x are one call (q+k+v, qkv+z, gate+up).
  virtual void linear(const LinearOut* outs, int n_outs, int64_t K, const float* x, int64_t M) = 0;
  // Dense fp32 w [N, K] (the GDN a/b projections); x fp32 [M, K]; y fp32 [M, N] = x w^T.
  virtual void dense_linear(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) = 0;

  // ---- normalisation (gains are the model's multiplicative gains) ---------------------------------
  virtual void rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) = 0;
  // h [rows, n] += delta; out = rmsnorm(h) * gain. out aliases neither.
  virtual void add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                           float* out) = 0;
  virtual void l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) = 0;
  // out [rows, Dv] = rmsnorm(o) * gain * silu(z); out may alias o.
  virtual void gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                             float* out) = 0;

  // ---- attention ----------------------------------------------------------------------------------
  // NEOX RoPE in place on x fp32 [M, n_heads, head_dim]; token m is at position p0 + m.
  virtual void rope_neox(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t p0,
                         float theta) = 0;
  // Causal GQA attention of M query rows at positions p0..p0+M-1: q fp32 [M, Hq, D]; k_cache, v_cache
  // fp32 [>= p0 + M, Hkv, D] with rows p0..p0+M-1 already written; out fp32 [M, Hq, D].
  virtual void attention(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0, int64_t Hq,
                         int64_t Hkv, int64_t D, float scale, float* out) = 0;

  // ---- elementwise --------------------------------------------------------------------------------
  virtual void sigmoid_gate_mul(float* x, const float* gate, int64_t n) = 0;  // x *= sigmoid(gate)
  virtual void silu_mul(const float* gate, const float* up, int64_t n, float* out) = 0;

  // ---- fused sites: the producer of a folded linear's input + its sign+FWHT, one op -----------------
  // The defaults are the unfused ops (every backend is correct as it is); a backend overrides them to
  // make one pass over each row instead of three or four.
  // Residual site: h fp32 [rows, n] += delta (nullptr: no add); out fp32 [rows, n] = rmsnorm(h) * gain
  // (the un-rotated normed residual); site fp32 [rows, n] = hadamard_forward(out, signs, block).
  // No buffer aliases another.
  virtual void add_rmsnorm_rotate(float* h, const float* delta, int64_t rows, int64_t n, const float* gain,
                                  float eps, float* out, float* site, const int8_t* signs, int64_t block) {
    if (delta) add_rmsnorm(h, delta, rows, n, gain, eps, out);
    else rmsnorm(h, rows, n, gain, eps, out);
    copy_rows(site, n, out, n, rows, n);
    hadamard_forward(site, rows, n, signs, block);
  }
  // SwiGLU site: gate, up fp32 [rows, n]; site fp32 [rows, n] = hadamard_forward(silu(gate) * up, signs,
  // block). site may alias gate or up.
  virtual void silu_mul_rotate(const float* gate, const float* up, int64_t rows, int64_t n, float* site,
                               const int8_t* signs, int64_t block) {
    silu_mul(gate, up, rows * n, site);
    hadamard_forward(site, rows, n, signs, block);
  }

  // ---- the SwiGLU FFN around a folded down projection (one op) --------------------------------------------
  // delta fp32 [M, E] = down . hadamard_forward(silu(x gate^T) * (x up^T), signs, block), x fp32 [M, E] the FFN input
  // site; fg / fu fp32 [M, F] scratch (gate / up rows). The default is the op sequence (the forward's own); a backend
  // overrides it to run the three products and the site as fewer launches.
  virtual void swiglu_ffn(const TernaryMatrix& gate, const TernaryMatrix& up, const TernaryMatrix& down, const float* x,
                          int64_t M, float* fg, float* fu, float* delta, const int8_t* signs, int64_t block) {
    const LinearOut in[2] = {{&gate, fg}, {&up, fu}};
    linear(in, 2, gate.cols, x, M);
    silu_mul_rotate(fg, fu, M, gate.rows, fg, signs, block);
    const LinearOut out{&down, delta};
    linear(&out, 1, gate.rows, fg, M);
  }

  // ---- the attention prologue: q / gate split, per-head q and k norms, RoPE, KV append (one op) ----
  // q = rope(rmsnorm(query) * q_gain), gate = the gate half, the K row rope(rmsnorm(k) * k_gain) and the V
  // row appended to the cache(s) (AttnPrep above). The default is the op sequence; a backend overrides it to
  // make one launch of the eight.
  virtual void attention_prep(const AttnPrep& a) {
    const int64_t Dh = a.Dh, row = a.Hkv * Dh;
    copy_rows(a.q, Dh, a.q_gate, 2 * Dh, a.M * a.H, Dh);
    copy_rows(a.gate, Dh, a.q_gate + Dh, 2 * Dh, a.M * a.H, Dh);
    rmsnorm(a.q, a.M * a.H, Dh, a.q_gain, a.eps, a.q);
    rmsnorm(a.k, a.M * a.Hkv, Dh, a.k_gain, a.eps, a.k);
    if (a.pos) {
      rope_neox_rows(a.q, a.M, a.H, Dh, a.rot_dims, a.pos, a.theta);
      rope_neox_rows(a.k, a.M, a.Hkv, Dh, a.rot_dims, a.pos, a.theta);
      kv_write_rows(a.k_caches, a.v_caches, a.pos, a.k, a.v, a.M, row);
    } else {
      rope_neox(a.q, a.M, a.H, Dh, a.rot_dims, a.p0, a.theta);
      rope_neox(a.k, a.M, a.Hkv, Dh, a.rot_dims, a.p0, a.theta);
      copy_rows(a.k_cache + a.p0 * row, 0, a.k, 0, 1, a.M * row);
      copy_rows(a.v_cache + a.p0 * row, 0, a.v, 0, 1, a.M * row);
    }
  }

  // ---- Gated DeltaNet (FACTS section 6) -----------------------------------------------------------
  // x fp32 [T, C]; conv_state fp32 [Kc-1, C] in place; taps fp32 [C, Kc]; out fp32 [T, C] = silu(conv).
  virtual void gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc,
                        float* out) = 0;
  // a, b fp32 [T, Nv]; A (= -exp(A_log)), dt_bias fp32 [Nv]; g = A softplus(a + dt_bias), beta = sigmoid(b).
  virtual void gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                         float* g, float* beta) = 0;
  // The delta rule over T tokens (state fp32 [Nv, Dk, Dv] in place; q, k [T, Nk, Dk]; v, out [T, Nv, Dv];
  // g, beta [T, Nv]). The backend picks the evaluation order (chunked WY form or token by token); every
  // choice computes the same recurrence and the engine tests that chunked prefill equals the walk.
  virtual void gdn_delta_rule(float* state, const float* q, const float* k, const float* v, const float* g,
                              const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                              float* out) = 0;

  // ---- batched decode: M sequences, one token each (Decoder::step_batch) ---------------------------
  // Row m of every activation is the next token of its OWN sequence, at position host_pos[m] (host
  // int64 [M], each >= 0). Per-sequence memory comes as host arrays of M pointers into this backend's
  // memory (one KV cache / conv state / recurrent state per row; the decoder guarantees no two rows
  // share one). Everything else of the step (embedding, norms, sites, every linear and the head) is the
  // ordinary ops at M rows, so the weights stream once for all M sequences.
  // The defaults loop over the rows calling the single-sequence op at M = 1 (exactly what a one-row
  // forward does), so every backend is correct as it is; a backend overrides them to do all rows in
  // one launch (host arrays are read during the call only: copy them if the launch is deferred).

  // NEOX RoPE in place on x fp32 [M, n_heads, head_dim]; row m at position host_pos[m].
  virtual void rope_neox_rows(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                              const int64_t* host_pos, float theta) {
    const int64_t stride = n_heads * head_dim;
    for (int64_t m = 0; m < M; ++m) rope_neox(x + m * stride, 1, n_heads, head_dim, rot_dims, host_pos[m], theta);
  }
  // KV append: k, v fp32 [M, row] (row = Hkv * D); k_caches[m], v_caches[m] fp32 [capacity_m, row]
  // with host_pos[m] < capacity_m: row host_pos[m] of cache m = row m of k (of v).
  virtual void kv_write_rows(float* const* k_caches, float* const* v_caches, const int64_t* host_pos,
                             const float* k, const float* v, int64_t M, int64_t row) {
    for (int64_t m = 0; m < M; ++m) {
      copy_rows(k_caches[m] + host_pos[m] * row, 0, k + m * row, 0, 1, row);
      copy_rows(v_caches[m] + host_pos[m] * row, 0, v + m * row, 0, 1, row);
    }
  }
  // GQA attention of row m over rows 0..host_pos[m] of its own caches: q fp32 [M, Hq, D];
  // k_caches[m], v_caches[m] fp32 [>= host_pos[m] + 1, Hkv, D] with row host_pos[m] already written;
  // out fp32 [M, Hq, D].
  virtual void attention_rows(const float* q, const float* const* k_caches, const float* const* v_caches,
                              const int64_t* host_pos, int64_t M, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                              float* out) {
    const int64_t stride = Hq * D;
    for (int64_t m = 0; m < M; ++m)
      attention(q + m * stride, k_caches[m], v_caches[m], 1, host_pos[m], Hq, Hkv, D, scale, out + m * stride);
  }
  // The GDN conv for one token per row: x, out fp32 [M, C]; conv_states[m] fp32 [Kc-1, C] (row m's
  // sequence, in place); taps fp32 [C, Kc]. out = silu(conv).
  virtual void gdn_conv_rows(const float* x, float* const* conv_states, const float* taps, int64_t M, int64_t C,
                             int64_t Kc, float* out) {
    for (int64_t m = 0; m < M; ++m) gdn_conv(x + m * C, conv_states[m], taps, 1, C, Kc, out + m * C);
  }
  // The delta rule for one token per row: states[m] fp32 [Nv, Dk, Dv] (row m's sequence, in place);
  // q, k fp32 [M, Nk, Dk]; v, out fp32 [M, Nv, Dv]; g, beta fp32 [M, Nv].
  virtual void gdn_delta_rule_rows(float* const* states, const float* q, const float* k, const float* v,
                                   const float* g, const float* beta, int64_t M, int64_t Nk, int64_t Nv, int64_t Dk,
                                   int64_t Dv, float* out) {
    const int64_t qk = Nk * Dk, vo = Nv * Dv;
    for (int64_t m = 0; m < M; ++m)
      gdn_delta_rule(states[m], q + m * qk, k + m * qk, v + m * vo, g + m * Nv, beta + m * Nv, 1, Nk, Nv, Dk, Dv,
                     out + m * vo);
  }
  // Greedy decode without the logits round trip: host_out int32 [rows] = the index of the largest
  // element of each row of x fp32 [rows, n] (lowest index on ties; NaN never wins; an all-NaN row gives
  // 0). Returns false when the backend has no such op (the default): the caller then copies x to the
  // host and picks there. Worth overriding where the copy costs ([32, 248k] fp32 = 32 MB per step).
  virtual bool argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* host_out) {
    (void)x, (void)rows, (void)n, (void)host_out;
    return false;
  }
  // Sampling without the logits round trip (engine Sampler::top_k_wanted): for the row x fp32 [n], first
  // the repetition penalty on the `penalized` tokens (n_penalized distinct ids in [0, n); in place, as
  // repetition_penalised below), then the k (>= 1) largest values, NaN dropped,
  // ordered by value descending, then index ascending, into host ids int32 [k] and values fp32 [k] (the
  // first min(k, count) written). Returns count, the row's non-NaN values; -1 when the backend has no such
  // op or the request is past its limits (k, n_penalized), and then x is left as it was.
  virtual int64_t top_k(float* x, int64_t n, int32_t k, float penalty, const int32_t* penalized,
                        int64_t n_penalized, int32_t* ids, float* values) {
    (void)x, (void)n, (void)k, (void)penalty, (void)penalized, (void)n_penalized, (void)ids, (void)values;
    return -1;
  }
};

// The repetition penalty (HF / CTRL) of one logit: a positive one divided by penalty, any other multiplied.
// The Sampler and Backend::top_k (HostBackend's; sampling.cu's device copy) apply exactly this.
inline float repetition_penalised(float v, float penalty) { return v > 0.0f ? v / penalty : v * penalty; }

// fp32 storage owned by a backend (host memory for ref / cpu, device memory for a GPU backend).
// Move-only; released through the backend that allocated it.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& be, size_t n) : be_(&be), p_(n ? be.allocate(n) : nullptr), n_(n) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : be_(o.be_), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_;
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() const { return p_; }
  size_t size() const { return n_; }
  uint64_t bytes() const { return uint64_t(n_) * sizeof(float); }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  void reset() {
    if (p_) be_->release(p_);
    p_ = nullptr;
    n_ = 0;
  }
  Backend* be_ = nullptr;
  float* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace bonsai
