// The hybrid decoder forward (Gated DeltaNet layers + gated full-attention layers), written once against
// the Backend interface (backend/backend.h). It reads like FACTS.md section 6:
//
//   h = embed(ids)                                     gather, then R^T when the table is inverse-rotated
//   for each layer:
//     x = rmsnorm(h) * attn_norm
//     h += attention(x) or gated_deltanet(x)
//     f = rmsnorm(h) * post_norm
//     h += down(silu(gate(f)) * up(f))
//   logits = head(rmsnorm(h) * out_norm)
//
// Hadamard sites (FACTS section 5) are explicit: hadamard_site() turns one activation into what every
// linear reading it needs, ONE transform per site shared by its readers:
//   normed residual -> {q, k, v} or {qkv, z};  mixer output -> o / out_proj (input_perm gather first);
//   normed residual -> {gate, up};  silu(gate) * up -> down;  final norm -> head.
// A site transforms only when its readers are `folded`; an unrotated pack has no transforms at all.
// GDN's a/b projections read the UN-rotated normed residual.
//
// One call consumes a chunk of M tokens (1 <= M <= max_chunk) of one sequence: every linear is one
// M-row GEMM, attention is causal over the chunk, the delta rule runs over the chunk in whatever order the
// backend picks. The same function is the prefill and the decode step (M = 1), so chunked prefill and the
// token walk cannot drift apart in anything but evaluation order (tested in tests/engine).
// step_batch() runs the same layers with the M rows taken from M different sequences (one token each):
// only the mixers' per-sequence work (RoPE position, KV cache, conv and recurrent state) differs by row.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace bonsai {

// The state one layer carries between calls, for one sequence.
struct LayerState {
  Buffer k, v;        // full attention: fp32 [capacity, Hkv, Dh] keys (q/k-normed, RoPE applied) and values
  Buffer conv;        // GDN: fp32 [Kc-1, C] the last Kc-1 qkv inputs of the conv, oldest row first
  Buffer recurrent;   // GDN: fp32 [Nv, Dk, Dv] the delta-rule state S per V head (grouped order)
};

// Everything one sequence carries between forward calls. Made by Decoder::new_state, owned by a Session.
struct DecoderState {
  int64_t capacity = 0;  // KV positions allocated (the most tokens this sequence can hold)
  int64_t pos = 0;       // tokens consumed so far = the position of the next token
  std::vector<LayerState> layers;
  uint64_t bytes() const;
};

enum class LogitsMode {
  None,  // no head (prefill chunks whose logits nobody reads)
  Last,  // logits of the last token of the chunk: host [V]
  All,   // logits of every token of the chunk: host [M, V] (teacher-forced evaluation)
};

class Decoder {
 public:
  // Checks that the model is one this forward runs (site readers agree on K / folded / input_perm,
  // signs exist for every folded width, head_dim == value_dim, ...), calls backend.prepare(model) and
  // allocates the activation workspace for chunks of up to max_chunk tokens (0: backend.prefill_chunk()).
  // Throws bonsai::Error. The model and the backend must outlive the decoder.
  Decoder(const Model& model, Backend& backend, int64_t max_chunk = 0);

  const Model& model() const { return m_; }
  Backend& backend() const { return be_; }
  int64_t max_chunk() const { return max_chunk_; }
  int64_t vocab() const { return m_.head.rows; }

  // A fresh, zeroed state for a sequence of up to `capacity` tokens (>= 1; not checked against the
  // model's context length here: the Session does that).
  DecoderState new_state(int64_t capacity) const;
  // Back to an empty sequence: conv and recurrent state zeroed, pos = 0 (KV rows are overwritten before
  // they are read, so they are left as they are).
  void reset(DecoderState& s) const;

  // Consumes ids[0..M) (host int32) at positions s.pos .. s.pos+M-1 and advances s.pos by M.
  // Preconditions, checked before anything is touched (bonsai::Error): 1 <= M <= max_chunk,
  // s.pos + M <= s.capacity, every id in [0, vocab). `logits` (host fp32) receives [V] for Last,
  // [M, V] for All, nothing for None (may be null then).
  void forward(DecoderState& s, const int32_t* ids, int64_t M, LogitsMode mode, float* logits);
  // forward(s, ids, M, Last, ...) with the last row's logits [V] kept on the backend, not copied to the
  // host, for ONE of the picks below (row 0; valid until the next forward). Same preconditions as forward.
  void forward_kept(DecoderState& s, const int32_t* ids, int64_t M);
  // step_batch with the logits [B, V] kept on the backend: row b for states[b], one pick per row.
  void step_batch_kept(DecoderState* const* states, const int32_t* ids, int64_t B);
  // Row `row` of the kept logits: its argmax (lowest index on ties, NaN never wins; all-NaN gives 0), picked
  // on the backend when it has Backend::argmax_rows (then only the token id comes back), else from a host copy.
  int32_t kept_argmax(int64_t row = 0);
  // Backend::top_k on row `row` of the kept logits (its penalty changes them in place): the count of non-NaN
  // logits, -1 when the backend cannot (nothing changed then).
  int64_t kept_top_k(int32_t k, float penalty, std::span<const int32_t> penalized, int32_t* ids, float* values,
                     int64_t row = 0);
  // Row `row` of the kept logits [V] to the host.
  void kept_logits(float* host, int64_t row = 0);

  // Batched decode: one new token for each of B sequences in ONE forward. Row b is ids[b] (host int32)
  // consumed by *states[b] at position states[b]->pos, which then advances by 1. Embedding, norms, sites,
  // every linear and the head run once at M = B rows (the weights stream once per step for all B);
  // RoPE, the KV write, attention, the GDN conv and delta rule use each row's own position and state
  // (Backend::*_rows). `logits` (host fp32) receives [B, V], row b for states[b].
  // Preconditions, checked before anything is touched (bonsai::Error): 1 <= B <= max_batch(), every
  // state non-null, made for this model, distinct from the others and with pos < capacity, every id in
  // [0, vocab), logits non-null. A row's result equals forward(*states[b], &ids[b], 1, Last, ...) up to
  // the float summation order of the M = B linears.
  void step_batch(DecoderState* const* states, const int32_t* ids, int64_t B, float* logits);
  // The same step for greedy decoding: next (host int32 [B]) = the argmax of each row's logits (lowest
  // index on ties, NaN never wins), picked on the backend when it has Backend::argmax_rows (no [B, V]
  // copy to the host), else on the host. Same preconditions (next instead of logits).
  void step_batch_argmax(DecoderState* const* states, const int32_t* ids, int64_t B, int32_t* next);
  // The most sequences one step_batch takes (the activation workspace's rows).
  int64_t max_batch() const { return max_chunk_; }

  // Bytes of state a decode step at position `pos` moves besides the weights: K and V rows read
  // (pos + 1 of them) and written (1) per attention layer; conv and recurrent state read and written per
  // GDN layer. For the GB/s figure.
  uint64_t state_bytes_per_step(int64_t pos) const;
  // Bytes of state one sequence of `capacity` positions holds (= new_state(capacity).bytes(), without
  // allocating): K and V caches per attention layer, conv and recurrent state per GDN layer.
  uint64_t state_bytes(int64_t capacity) const;

 private:
  // Hadamard site: the activation x fp32 [M, reader.cols] as `reader` (and every other linear at this
  // site) must read it. Gather by input_perm when set, then sign + FWHT when folded, into the site
  // workspace; with neither, x itself is returned (no copy).
  const float* hadamard_site(const float* x, int64_t M, const TernaryMatrix& reader);
  // The residual norm feeding `reader` (nullptr: no linear reads it rotated): h += delta (nullptr: none),
  // x = rmsnorm(h) * gain; when reader is folded (no gather) the rotated copy goes to ws_.site in the same
  // op (Backend::add_rmsnorm_rotate) and the next hadamard_site(ws_.x) returns it.
  void norm_site(const float* delta, int64_t M, const float* gain, const TernaryMatrix* reader);
  bool x_rotated_ = false;  // ws_.site holds rotate(ws_.x) (norm_site), consumed by one hadamard_site
  // Who the M rows of one forward are: a chunk of ONE sequence (`seq`, rows at positions p0 .. p0+M-1)
  // or a batch of M sequences, one token each (`batch[m]` at batch_pos_[m]); exactly one is set.
  struct Rows {
    int64_t M = 0;
    DecoderState* seq = nullptr;
    int64_t p0 = 0;
    DecoderState* const* batch = nullptr;
  };
  // The whole forward over `rows` (positions not advanced here); the head as `mode` asks.
  // `logits` null: the head's output stays in ws_.logits (the argmax step reads it there).
  void run(const int32_t* ids, const Rows& rows, LogitsMode mode, float* logits);
  // The step of step_batch / step_batch_argmax / step_batch_kept: the checks (nothing touched on error;
  // has_out: the caller's host output is there), then the forward of the batch's rows (fills batch_pos_) with
  // the logits [B, V] left in ws_.logits, and every position advanced.
  void run_batch(DecoderState* const* states, const int32_t* ids, int64_t B, bool has_out);
  // forward's checks (nothing touched on error), then the rows of the chunk.
  Rows begin_chunk(DecoderState& s, const int32_t* ids, int64_t M) const;
  // next (host int32 [rows]) = the argmax of each of `rows` rows of ws_.logits from row `first`, on the
  // backend when it can (Backend::argmax_rows), else from a host copy.
  void argmax_of_logits(int64_t first, int64_t rows, int32_t* next);
  void attention_block(const LayerWeights& L, size_t l, const Rows& rows);
  void gdn_block(const LayerWeights& L, size_t l, const Rows& rows);
  void ffn_block(const LayerWeights& L, int64_t M);
  void check_model() const;

  const Model& m_;
  Backend& be_;
  int64_t max_chunk_;

  // Activation workspace, [max_chunk, width] each; reused by every layer and every call.
  struct Workspace {
    Buffer h;          // [M, E] the residual stream
    Buffer x;          // [M, E] normed residual (attn_norm, then post_norm, then the next layer's)
    Buffer delta;      // [M, E] a block's output, added to h
    Buffer site;       // [M, max K of any linear] the transformed activation of the current site
    Buffer q_gate;     // [M, 2*H*Dh] q_proj output, per head [Dh query | Dh gate]
    Buffer q, gate;    // [M, H, Dh]
    Buffer k, v;       // [M, Hkv, Dh]
    Buffer attn;       // [M, H, Dh]
    Buffer qkv, conv;  // [M, C] GDN in_proj_qkv output, conv + SiLU output
    Buffer z;          // [M, Nv*Dv]
    Buffer a, b;       // [M, Nv]
    Buffer g, beta;    // [M, Nv]
    Buffer gq, gk;     // [M, Nk, Dk]
    Buffer gv, go;     // [M, Nv, Dv]
    Buffer ff_gate, ff_up;  // [M, max FF]
    Buffer logits;     // [1, V]; grows to [max_chunk, V] on the first LogitsMode::All or batch of B > 1
  } ws_;
  // Batched decode: host tables refilled per step (positions) and per layer (state pointers).
  std::vector<int64_t> batch_pos_;                  // [max_batch] position of each row
  std::vector<float*> batch_ptr_a_, batch_ptr_b_;   // [max_batch] k caches / conv states, v caches / recurrent
  std::vector<float> host_logits_;  // [max_batch, V] argmax_of_logits on a backend without argmax_rows; first use
};

}  // namespace bonsai
