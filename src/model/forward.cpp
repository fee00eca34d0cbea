#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "util/error.h"

namespace bonsai {

namespace {

constexpr float kL2NormEps = 1e-6f;  // GDN q/k l2norm: x * rsqrt(sum x^2 + 1e-6) (FACTS section 6)

int64_t max_ffn(const ModelConfig& c) {
  int64_t f = 0;
  for (int64_t x : c.ffn) f = std::max(f, x);
  return f;
}

}  // namespace

uint64_t DecoderState::bytes() const {
  uint64_t b = 0;
  for (const LayerState& l : layers) b += l.k.bytes() + l.v.bytes() + l.conv.bytes() + l.recurrent.bytes();
  return b;
}

// ---- construction ------------------------------------------------------------------------------------

void Decoder::check_model() const {
  const ModelConfig& c = m_.config;
  const std::string& src = m_.source_path;
  if (int64_t(m_.layers.size()) != c.n_layers || c.n_layers < 1)
    fail("{}: {} layers loaded, the config says {}", src, m_.layers.size(), c.n_layers);
  if (c.head_dim != c.value_dim)
    fail("{}: attention key_length {} != value_length {} is not supported (the output gate is per key dim)", src,
         c.head_dim, c.value_dim);
  if (c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0)
    fail("{}: head_count {} is not a multiple of head_count_kv {}", src, c.n_heads, c.n_kv_heads);
  if (c.n_full_attention() < int64_t(c.n_layers) && (c.gdn_k_heads < 1 || c.gdn_v_heads % c.gdn_k_heads != 0))
    fail("{}: GDN V heads {} is not a multiple of K heads {}", src, c.gdn_v_heads, c.gdn_k_heads);
  if (m_.head.rows != c.vocab || m_.embed.rows != c.vocab)
    fail("{}: embedding rows {} / head rows {} differ from the vocabulary size {}", src, m_.embed.rows, m_.head.rows,
         c.vocab);
  if (m_.embed_inverse && !m_.hadamard.enabled)
    fail("{}: token_embd is inverse-rotated but the pack has no Hadamard rotation", src);
  if (m_.embed_inverse) (void)m_.hadamard.signs_for(c.hidden);

  // Every reader of one site must see the same activation: same K, same folded flag, no per-reader gather.
  auto site = [&](std::initializer_list<const TernaryMatrix*> readers, int64_t K, bool perm_allowed) {
    const TernaryMatrix& first = **readers.begin();
    for (const TernaryMatrix* t : readers) {
      if (t->cols != K) fail("{}: {} has K = {}, expected {}", src, t->name, t->cols, K);
      if (t->folded != first.folded)
        fail("{}: {} and {} read one activation site but only one of them is folded", src, first.name, t->name);
      if (!t->input_perm.empty() && (!perm_allowed || int64_t(t->input_perm.size()) != K))
        fail("{}: {} has an input permutation of {} entries where none (or K = {}) is allowed", src, t->name,
             t->input_perm.size(), K);
      if (t->folded) {
        if (!m_.hadamard.enabled) fail("{}: {} is folded but the pack has no Hadamard rotation", src, t->name);
        (void)m_.hadamard.signs_for(K);  // throws naming the width when there is no sign vector for it
      }
    }
  };
  const int64_t E = c.hidden;
  for (const LayerWeights& L : m_.layers) {
    if (L.full_attention) {
      site({&L.attn.q, &L.attn.k, &L.attn.v}, E, false);
      site({&L.attn.o}, c.attn_out(), true);
      if (L.attn.q.rows != c.q_rows() || L.attn.k.rows != c.kv_rows() || L.attn.v.rows != c.kv_rows())
        fail("{}: {} / {} / {} rows differ from the config", src, L.attn.q.name, L.attn.k.name, L.attn.v.name);
    } else {
      site({&L.gdn.qkv, &L.gdn.z}, E, false);
      site({&L.gdn.out}, c.gdn_value_dim(), true);
      if (L.gdn.qkv.rows != c.gdn_conv_channels() || L.gdn.z.rows != c.gdn_value_dim())
        fail("{}: {} / {} rows differ from the config", src, L.gdn.qkv.name, L.gdn.z.name);
    }
    site({&L.gate, &L.up}, E, false);
    site({&L.down}, L.gate.rows, true);
  }
  site({&m_.head}, E, false);
}

Decoder::Decoder(const Model& model, Backend& backend, int64_t max_chunk)
    : m_(model), be_(backend), max_chunk_(max_chunk == 0 ? backend.prefill_chunk() : max_chunk) {
  if (max_chunk_ < 1) fail("decoder: max_chunk must be >= 1 (or 0: the backend's prefill chunk), got {}", max_chunk);
  check_model();
  be_.prepare(m_);

  const ModelConfig& c = m_.config;
  const size_t M = size_t(max_chunk_);
  const size_t E = size_t(c.hidden), H = size_t(c.n_heads), Hkv = size_t(c.n_kv_heads), Dh = size_t(c.head_dim);
  const size_t C = size_t(c.gdn_conv_channels()), KD = size_t(c.gdn_key_dim()), VD = size_t(c.gdn_value_dim());
  const size_t Nv = size_t(c.gdn_v_heads), FF = size_t(max_ffn(c));
  const bool any_attn = c.n_full_attention() > 0, any_gdn = c.n_full_attention() < c.n_layers;
  const size_t max_k = std::max({E, any_attn ? H * Dh : 0, any_gdn ? VD : 0, FF});
  Backend& b = be_;
  ws_.h = Buffer(b, M * E);
  ws_.x = Buffer(b, M * E);
  ws_.delta = Buffer(b, M * E);
  ws_.site = Buffer(b, M * max_k);
  if (any_attn) {
    ws_.q_gate = Buffer(b, M * 2 * H * Dh);
    ws_.q = Buffer(b, M * H * Dh);
    ws_.gate = Buffer(b, M * H * Dh);
    ws_.k = Buffer(b, M * Hkv * Dh);
    ws_.v = Buffer(b, M * Hkv * Dh);
    ws_.attn = Buffer(b, M * H * Dh);
  }
  if (any_gdn) {
    ws_.qkv = Buffer(b, M * C);
    ws_.conv = Buffer(b, M * C);
    ws_.z = Buffer(b, M * VD);
    ws_.a = Buffer(b, M * Nv);
    ws_.b = Buffer(b, M * Nv);
    ws_.g = Buffer(b, M * Nv);
    ws_.beta = Buffer(b, M * Nv);
    ws_.gq = Buffer(b, M * KD);
    ws_.gk = Buffer(b, M * KD);
    ws_.gv = Buffer(b, M * VD);
    ws_.go = Buffer(b, M * VD);
  }
  ws_.ff_gate = Buffer(b, M * FF);
  ws_.ff_up = Buffer(b, M * FF);
  ws_.logits = Buffer(b, size_t(vocab()));
  batch_pos_.resize(M);
  batch_ptr_a_.resize(M);
  batch_ptr_b_.resize(M);
}

DecoderState Decoder::new_state(int64_t capacity) const {
  if (capacity < 1) fail("decoder state: capacity must be >= 1 token, got {}", capacity);
  const ModelConfig& c = m_.config;
  DecoderState s;
  s.capacity = capacity;
  s.layers.resize(m_.layers.size());
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    LayerState& st = s.layers[l];
    if (m_.layers[l].full_attention) {
      const size_t kv = size_t(capacity) * size_t(c.kv_rows());
      st.k = Buffer(be_, kv);
      st.v = Buffer(be_, kv);
    } else {
      st.conv = Buffer(be_, size_t(c.conv_kernel - 1) * size_t(c.gdn_conv_channels()));
      st.recurrent = Buffer(be_, size_t(c.gdn_v_heads) * size_t(c.gdn_head_dim) * size_t(c.gdn_head_dim));
    }
  }
  return s;
}

void Decoder::reset(DecoderState& s) const {
  for (LayerState& st : s.layers) {
    if (st.conv) be_.zero(st.conv.data(), st.conv.size());
    if (st.recurrent) be_.zero(st.recurrent.data(), st.recurrent.size());
  }
  s.pos = 0;
}

uint64_t Decoder::state_bytes_per_step(int64_t pos) const {
  const ModelConfig& c = m_.config;
  uint64_t b = 0;
  for (const LayerWeights& L : m_.layers) {
    if (L.full_attention) {
      b += 2 * uint64_t(pos + 2) * uint64_t(c.kv_rows()) * 4;  // K and V: pos + 1 rows read, 1 written
    } else {
      b += 2 * uint64_t(c.conv_kernel - 1) * uint64_t(c.gdn_conv_channels()) * 4;                       // conv r+w
      b += 2 * uint64_t(c.gdn_v_heads) * uint64_t(c.gdn_head_dim) * uint64_t(c.gdn_head_dim) * 4;  // S r+w
    }
  }
  return b;
}

uint64_t Decoder::state_bytes(int64_t capacity) const {
  const ModelConfig& c = m_.config;
  uint64_t b = 0;
  for (const LayerWeights& L : m_.layers) {
    if (L.full_attention) b += 2 * uint64_t(capacity) * uint64_t(c.kv_rows()) * 4;  // K and V
    else
      b += (uint64_t(c.conv_kernel - 1) * uint64_t(c.gdn_conv_channels()) +
            uint64_t(c.gdn_v_heads) * uint64_t(c.gdn_head_dim) * uint64_t(c.gdn_head_dim)) *
           4;  // conv + recurrent
  }
  return b;
}

// ---- the forward -------------------------------------------------------------------------------------

void Decoder::norm_site(const float* delta, int64_t M, const float* gain, const TernaryMatrix* reader) {
  const ModelConfig& c = m_.config;
  const int64_t E = c.hidden;
  float *h = ws_.h.data(), *x = ws_.x.data();
  // A folded reader (with no column gather) gets its sign+FWHT in the same op: one pass per row.
  x_rotated_ = reader && reader->folded && reader->input_perm.empty();
  if (x_rotated_)
    be_.add_rmsnorm_rotate(h, delta, M, E, gain, c.rms_eps, x, ws_.site.data(), m_.hadamard.signs_for(E),
                           m_.hadamard.block);
  else if (delta) be_.add_rmsnorm(h, delta, M, E, gain, c.rms_eps, x);
  else be_.rmsnorm(h, M, E, gain, c.rms_eps, x);
}

const float* Decoder::hadamard_site(const float* x, int64_t M, const TernaryMatrix& reader) {
  const int64_t K = reader.cols;
  // The fused norm site already wrote rotate(ws_.x) into ws_.site (norm_site); it is read once.
  const bool fused = x_rotated_ && x == ws_.x.data();
  x_rotated_ = false;
  if (fused) return ws_.site.data();
  if (!reader.folded && reader.input_perm.empty()) return x;
  float* out = ws_.site.data();
  // A folded GDN out_proj whose columns stay tiled reads the activation permuted BEFORE sign + transform.
  if (!reader.input_perm.empty()) be_.permute_cols(x, M, K, reader.input_perm.data(), out);
  else be_.copy_rows(out, K, x, K, M, K);
  if (reader.folded) be_.hadamard_forward(out, M, K, m_.hadamard.signs_for(K), m_.hadamard.block);  // sign, then FWHT
  return out;
}

void Decoder::attention_block(const LayerWeights& L, size_t l, const Rows& rows) {
  const ModelConfig& c = m_.config;
  const int64_t M = rows.M, p0 = rows.p0;
  const AttentionWeights& A = L.attn;
  const int64_t E = c.hidden, H = c.n_heads, Hkv = c.n_kv_heads, Dh = c.head_dim;
  float *q_gate = ws_.q_gate.data(), *q = ws_.q.data(), *gate = ws_.gate.data();
  float *k = ws_.k.data(), *v = ws_.v.data(), *o = ws_.attn.data();

  // Site: normed residual -> {q, k, v}.
  const float* xr = hadamard_site(ws_.x.data(), M, A.q);
  const LinearOut qkv[3] = {{&A.q, q_gate}, {&A.k, k}, {&A.v, v}};
  be_.linear(qkv, 3, E, xr, M);

  // q_proj rows per head are [Dh query | Dh gate]: split into q [M, H, Dh] and gate [M, H, Dh]; per-head
  // RMSNorm of q and k, NEOX RoPE on the first rope_dims dims, and the K / V rows appended to the cache.
  const float scale = float(1.0 / std::sqrt(double(Dh)));
  AttnPrep prep{q_gate, q, gate, k, v, A.q_norm.data(), A.k_norm.data(), M, H, Hkv, Dh, c.rope_dims, c.rms_eps,
                c.rope_theta};
  if (rows.batch) {
    // Batched decode: row m is sequence batch[m] at its own position, with its own KV cache.
    float **kc = batch_ptr_a_.data(), **vc = batch_ptr_b_.data();  // [M] host tables of cache pointers
    for (int64_t m = 0; m < M; ++m) {
      kc[m] = rows.batch[m]->layers[l].k.data();
      vc[m] = rows.batch[m]->layers[l].v.data();
    }
    prep.pos = batch_pos_.data();
    prep.k_caches = kc;
    prep.v_caches = vc;
    be_.attention_prep(prep);
    be_.attention_rows(q, kc, vc, prep.pos, M, H, Hkv, Dh, scale, o);
  } else {
    LayerState& st = rows.seq->layers[l];
    prep.p0 = p0;
    prep.k_cache = st.k.data();
    prep.v_cache = st.v.data();
    be_.attention_prep(prep);
    // Causal GQA attention, scale 1/sqrt(Dh).
    be_.attention(q, st.k.data(), st.v.data(), M, p0, H, Hkv, Dh, scale, o);
  }
  // The output gate: out *= sigmoid(gate).
  be_.sigmoid_gate_mul(o, gate, M * H * Dh);

  // Site: attention output -> o_proj.
  const float* orot = hadamard_site(o, M, A.o);
  const LinearOut out{&A.o, ws_.delta.data()};
  be_.linear(&out, 1, H * Dh, orot, M);
}

void Decoder::gdn_block(const LayerWeights& L, size_t l, const Rows& rows) {
  const ModelConfig& c = m_.config;
  const int64_t M = rows.M;
  const GdnWeights& G = L.gdn;
  const int64_t E = c.hidden, Nk = c.gdn_k_heads, Nv = c.gdn_v_heads, Dk = c.gdn_head_dim, Dv = c.gdn_head_dim;
  const int64_t C = c.gdn_conv_channels(), KD = c.gdn_key_dim(), VD = c.gdn_value_dim(), Kc = c.conv_kernel;
  float *qkv = ws_.qkv.data(), *conv = ws_.conv.data(), *z = ws_.z.data();
  float *a = ws_.a.data(), *b = ws_.b.data(), *g = ws_.g.data(), *beta = ws_.beta.data(), *o = ws_.go.data();
  const float* x = ws_.x.data();

  // Site: normed residual -> {qkv, z}. The a/b projections are not folded: they read x un-rotated.
  const float* xr = hadamard_site(x, M, G.qkv);
  const LinearOut in[2] = {{&G.qkv, qkv}, {&G.z, z}};
  be_.linear(in, 2, E, xr, M);
  be_.dense_linear(G.a.data(), Nv, E, x, M, a);
  be_.dense_linear(G.b.data(), Nv, E, x, M, b);

  // Causal depthwise conv (+ SiLU) over the q | k | v channels, carrying the last Kc-1 inputs.
  float** conv_states = batch_ptr_a_.data();  // batched: [M] host table, row m's conv state
  float** rec_states = batch_ptr_b_.data();   // batched: [M] host table, row m's recurrent state
  if (rows.batch) {
    for (int64_t m = 0; m < M; ++m) {
      conv_states[m] = rows.batch[m]->layers[l].conv.data();
      rec_states[m] = rows.batch[m]->layers[l].recurrent.data();
    }
    be_.gdn_conv_rows(qkv, conv_states, G.conv.data(), M, C, Kc, conv);
  } else {
    be_.gdn_conv(qkv, rows.seq->layers[l].conv.data(), G.conv.data(), M, C, Kc, conv);
  }

  // Split q [M, Nk, Dk], k [M, Nk, Dk], v [M, Nv, Dv]. One token: they are contiguous pieces of the row.
  float *q = conv, *k = conv + KD, *v = conv + 2 * KD;
  if (M > 1) {
    q = ws_.gq.data();
    k = ws_.gk.data();
    v = ws_.gv.data();
    be_.copy_rows(q, KD, conv, C, M, KD);
    be_.copy_rows(k, KD, conv + KD, C, M, KD);
    be_.copy_rows(v, VD, conv + 2 * KD, C, M, VD);
  }
  // l2-normalise q and k per head; q *= 1/sqrt(Dk).
  be_.l2norm_heads(q, M * Nk, Dk, kL2NormEps);
  be_.l2norm_heads(k, M * Nk, Dk, kL2NormEps);
  be_.scale(q, size_t(M * KD), float(1.0 / std::sqrt(double(Dk))));

  // beta = sigmoid(b), g = A * softplus(a + dt_bias); the delta rule (V head h reads K head h / (Nv/Nk)).
  be_.gdn_gates(a, b, G.A.data(), G.dt_bias.data(), M, Nv, g, beta);
  if (rows.batch) be_.gdn_delta_rule_rows(rec_states, q, k, v, g, beta, M, Nk, Nv, Dk, Dv, o);
  else be_.gdn_delta_rule(rows.seq->layers[l].recurrent.data(), q, k, v, g, beta, M, Nk, Nv, Dk, Dv, o);

  // Gated RMSNorm per head: rmsnorm(o) * ssm_norm * silu(z).
  be_.gated_rmsnorm(o, z, G.norm.data(), M * Nv, Dv, c.rms_eps, o);

  // Site: GDN output -> out_proj (input_perm gather first when its columns are tiled).
  const float* orot = hadamard_site(o, M, G.out);
  const LinearOut out{&G.out, ws_.delta.data()};
  be_.linear(&out, 1, VD, orot, M);
}

void Decoder::ffn_block(const LayerWeights& L, int64_t M) {
  const int64_t E = m_.config.hidden, FF = L.gate.rows;
  float *fg = ws_.ff_gate.data(), *fu = ws_.ff_up.data();
  // Site: normed residual -> {gate, up}.
  const float* xr = hadamard_site(ws_.x.data(), M, L.gate);
  // A folded down projection: the whole FFN as one backend op (SwiGLU + sign+FWHT over fg between the products).
  if (L.down.folded && L.down.input_perm.empty()) {
    be_.swiglu_ffn(L.gate, L.up, L.down, xr, M, fg, fu, ws_.delta.data(), m_.hadamard.signs_for(FF), m_.hadamard.block);
    return;
  }
  const LinearOut in[2] = {{&L.gate, fg}, {&L.up, fu}};
  be_.linear(in, 2, E, xr, M);
  // Site: silu(gate) * up -> down.
  be_.silu_mul(fg, fu, M * FF, fg);
  const float* arot = hadamard_site(fg, M, L.down);
  const LinearOut out{&L.down, ws_.delta.data()};
  be_.linear(&out, 1, FF, arot, M);
}

Decoder::Rows Decoder::begin_chunk(DecoderState& s, const int32_t* ids, int64_t M) const {
  if (M < 1 || M > max_chunk_) fail("forward: chunk of {} tokens (1..{} supported)", M, max_chunk_);
  if (s.pos + M > s.capacity)
    fail("forward: {} tokens at position {} exceed the sequence capacity of {} positions", M, s.pos, s.capacity);
  if (s.layers.size() != m_.layers.size()) fail("forward: the state was made for another model");
  for (int64_t i = 0; i < M; ++i)
    if (ids[i] < 0 || ids[i] >= vocab()) fail("forward: token id {} is outside the vocabulary [0, {})", ids[i], vocab());
  Rows rows;
  rows.M = M;
  rows.seq = &s;
  rows.p0 = s.pos;
  return rows;
}

void Decoder::forward(DecoderState& s, const int32_t* ids, int64_t M, LogitsMode mode, float* logits) {
  const Rows rows = begin_chunk(s, ids, M);
  if (mode != LogitsMode::None && !logits) fail("forward: no logits buffer");
  run(ids, rows, mode, logits);
  s.pos += M;
}

void Decoder::run_batch(DecoderState* const* states, const int32_t* ids, int64_t B, bool has_out) {
  if (B < 1 || B > max_batch()) fail("step_batch: batch of {} sequences (1..{} supported)", B, max_batch());
  if (!states || !ids || !has_out) fail("step_batch: null states, ids or output");
  for (int64_t b = 0; b < B; ++b) {
    const DecoderState* s = states[b];
    if (!s) fail("step_batch: sequence {} of the batch has no state", b);
    if (s->layers.size() != m_.layers.size()) fail("step_batch: the state of sequence {} was made for another model", b);
    if (s->pos >= s->capacity)
      fail("step_batch: sequence {} is full ({} of {} positions used): it cannot take another token", b, s->pos,
           s->capacity);
    if (ids[b] < 0 || ids[b] >= vocab())
      fail("step_batch: sequence {}'s token id {} is outside the vocabulary [0, {})", b, ids[b], vocab());
    for (int64_t o = 0; o < b; ++o)  // two rows on one state would both write its KV row and recurrence
      if (states[o] == s) fail("step_batch: sequences {} and {} are the same state", o, b);
  }
  for (int64_t b = 0; b < B; ++b) batch_pos_[size_t(b)] = states[b]->pos;
  Rows rows;
  rows.M = B;
  rows.batch = states;
  run(ids, rows, LogitsMode::All, nullptr);  // logits [B, V] stay in ws_.logits
  for (int64_t b = 0; b < B; ++b) ++states[b]->pos;
}

void Decoder::step_batch(DecoderState* const* states, const int32_t* ids, int64_t B, float* logits) {
  run_batch(states, ids, B, logits != nullptr);
  be_.copy_to_host(ws_.logits.data(), size_t(B * vocab()), logits);
}

void Decoder::step_batch_argmax(DecoderState* const* states, const int32_t* ids, int64_t B, int32_t* next) {
  run_batch(states, ids, B, next != nullptr);
  argmax_of_logits(0, B, next);
}

void Decoder::step_batch_kept(DecoderState* const* states, const int32_t* ids, int64_t B) {
  run_batch(states, ids, B, true);  // the logits are the output, kept on the backend
}

void Decoder::forward_kept(DecoderState& s, const int32_t* ids, int64_t M) {
  const Rows rows = begin_chunk(s, ids, M);
  run(ids, rows, LogitsMode::Last, nullptr);  // the last row's logits [V] stay in ws_.logits
  s.pos += M;
}

int32_t Decoder::kept_argmax(int64_t row) {
  int32_t next = 0;
  argmax_of_logits(row, 1, &next);
  return next;
}

int64_t Decoder::kept_top_k(int32_t k, float penalty, std::span<const int32_t> penalized, int32_t* ids,
                            float* values, int64_t row) {
  return be_.top_k(ws_.logits.data() + row * vocab(), vocab(), k, penalty, penalized.data(),
                   int64_t(penalized.size()), ids, values);
}

void Decoder::kept_logits(float* host, int64_t row) {
  be_.copy_to_host(ws_.logits.data() + row * vocab(), size_t(vocab()), host);
}

void Decoder::argmax_of_logits(int64_t first, int64_t rows, int32_t* next) {
  const int64_t V = vocab();
  const float* x = ws_.logits.data() + first * V;
  if (be_.argmax_rows(x, rows, V, next)) return;
  if (host_logits_.size() < size_t(rows * V)) host_logits_.resize(size_t(max_batch() * V));
  be_.copy_to_host(x, size_t(rows * V), host_logits_.data());
  for (int64_t b = 0; b < rows; ++b) {  // lowest index on ties, NaN never wins, all-NaN -> 0
    const float* row = host_logits_.data() + b * V;
    int64_t best = -1;
    for (int64_t i = 0; i < V; ++i)
      if (!std::isnan(row[i]) && (best < 0 || row[i] > row[best])) best = i;
    next[b] = int32_t(best < 0 ? 0 : best);
  }
}

void Decoder::run(const int32_t* ids, const Rows& rows, LogitsMode mode, float* logits) {
  const ModelConfig& c = m_.config;
  const int64_t M = rows.M, E = c.hidden, V = vocab();
  float *h = ws_.h.data(), *x = ws_.x.data(), *delta = ws_.delta.data();

  // Embedding: gather + de-quantise the rows; an inverse-rotated table then gets R^T (transform, then signs).
  be_.embed_rows(m_.embed, ids, M, h);
  if (m_.embed_inverse) be_.hadamard_inverse(h, M, E, m_.hadamard.signs_for(E), m_.hadamard.block);

  // Each residual norm also rotates x for the site that reads it next (norm_site).
  const auto mixer_reader = [&](const LayerWeights& L) { return L.full_attention ? &L.attn.q : &L.gdn.qkv; };
  // The head site rotates only when every row goes to the head (a Last chunk rotates its one row there).
  const TernaryMatrix* head_reader = mode == LogitsMode::All || M == 1 ? &m_.head : nullptr;
  norm_site(nullptr, M, m_.layers[0].attn_norm.data(), mixer_reader(m_.layers[0]));
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const LayerWeights& L = m_.layers[l];
    if (L.full_attention) attention_block(L, l, rows);
    else gdn_block(L, l, rows);
    norm_site(delta, M, L.post_norm.data(), &L.gate);  // h += mixer; x = f
    ffn_block(L, M);
    const float* next_gain = l + 1 < m_.layers.size() ? m_.layers[l + 1].attn_norm.data() : m_.out_norm.data();
    const TernaryMatrix* next_reader =
        l + 1 < m_.layers.size() ? mixer_reader(m_.layers[l + 1]) : mode == LogitsMode::None ? nullptr : head_reader;
    norm_site(delta, M, next_gain, next_reader);  // h += ffn; x = next layer's (or final) norm
  }
  if (mode == LogitsMode::None) return;

  // Head over the rows whose logits are wanted. Site: final norm -> head.
  const int64_t r0 = mode == LogitsMode::Last ? M - 1 : 0, n_out = M - r0;
  if (ws_.logits.size() < size_t(n_out * V)) ws_.logits = Buffer(be_, size_t(max_chunk_ * V));  // first All only
  const float* xr = hadamard_site(x + r0 * E, n_out, m_.head);
  const LinearOut out{&m_.head, ws_.logits.data()};
  be_.linear(&out, 1, E, xr, n_out);
  if (logits) be_.copy_to_host(ws_.logits.data(), size_t(n_out * V), logits);
}

}  // namespace bonsai
