#include "pack/float_model.h"

#include <algorithm>
#include <cmath>

#include "format/ternary_codec.h"
#include "model/pack.h"
#include "model/tensor_names.h"
#include "pack/rng.h"
#include "util/error.h"
#include "util/half.h"

namespace bonsai {

namespace {

// The five norms the converters store as 1 + w (HF's Qwen3_5RMSNorm computes x * (1 + w)).
bool plus_one_norm(Role r) {
  return r == Role::AttnNorm || r == Role::PostAttnNorm || r == Role::OutputNorm || r == Role::AttnQNorm ||
         r == Role::AttnKNorm;
}

std::vector<float> draw(Rng& rng, size_t n, double scale, bool uniform = false, double lo = 0, double hi = 0) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(uniform ? rng.uniform(lo, hi) : rng.normal() * scale);
  return v;
}

}  // namespace

// make-pack's own fp64 transform, kept apart from backend/ref on purpose: the round-trip tests check the
// packs it writes with the ref backend's transform, so one implementation checks the other.
void fwht_rows_f64(double* x, int64_t K, const int8_t* signs, int64_t block, bool inverse) {
  if (!inverse && signs)
    for (int64_t i = 0; i < K; ++i) x[i] *= signs[i];
  const double norm = 1.0 / std::sqrt(double(block));
  for (int64_t b = 0; b < K; b += block) {
    double* v = x + b;
    for (int64_t h = 1; h < block; h *= 2)
      for (int64_t i = 0; i < block; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const double a = v[j], c = v[j + h];
          v[j] = a + c;
          v[j + h] = a - c;
        }
    for (int64_t i = 0; i < block; ++i) v[i] *= norm;
  }
  if (inverse && signs)
    for (int64_t i = 0; i < K; ++i) x[i] *= signs[i];
}

FloatModel draw_float_model(const ModelConfig& c, uint64_t seed) {
  FloatModel f;
  f.config = c;
  const auto specs = tensor_specs(c);
  uint64_t stream = 0;
  for (const TensorSpec& s : specs) {
    Rng rng(Rng::mix(seed, ++stream));
    const size_t n = size_t(s.rows() * s.cols());
    const double K = double(s.cols());
    std::vector<float> v;
    switch (s.role) {
      case Role::TokenEmbd: v = draw(rng, n, 1.0); break;
      case Role::Output: v = draw(rng, n, 3.0 / std::sqrt(K)); break;  // logits spread of a few units
      case Role::AttnNorm: case Role::PostAttnNorm: case Role::OutputNorm:
      case Role::AttnQNorm: case Role::AttnKNorm: v = draw(rng, n, 0, true, -0.4, 0.4); break;
      case Role::GdnNorm: v = draw(rng, n, 0, true, 0.6, 1.4); break;
      case Role::GdnA: {  // A_log = log(A), A ~ U(1, 16) as HF initialises it
        v.resize(n);
        for (auto& x : v) x = float(std::log(rng.uniform(1.0, 16.0)));
        break;
      }
      case Role::GdnDtBias: v = draw(rng, n, 0, true, -1.0, 1.0); break;
      case Role::GdnConv: v = draw(rng, n, 0, true, -0.5, 0.5); break;
      case Role::GdnAlpha: case Role::GdnBeta: v = draw(rng, n, 1.0 / std::sqrt(K)); break;
      default: v = draw(rng, n, 1.0 / std::sqrt(K)); break;  // ternary linears
    }
    f.tensors[s.hf_name] = std::move(v);
  }
  return f;
}

HadamardRotation draw_rotation(const ModelConfig& c, int64_t block, uint64_t seed) {
  HadamardRotation r;
  r.enabled = true;
  r.block = block;
  r.explicit_signs = true;
  // Widths in the real file's order: the residual stream, the attention/GDN outputs, the FFN.
  std::vector<int64_t> widths{c.hidden};
  auto add = [&](int64_t w) {
    if (std::find(widths.begin(), widths.end(), w) == widths.end()) widths.push_back(w);
  };
  add(c.attn_out());
  add(c.gdn_value_dim());
  for (int64_t ff : c.ffn) add(ff);
  static const int8_t anchor[16] = {-1, -1, -1, 1, -1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1};
  Rng rng(Rng::mix(seed, 0x5151));
  for (int64_t w : widths) {
    if (w % block != 0) fail("width {} is not a multiple of the Hadamard block {}", w, block);
    std::vector<int8_t> s(static_cast<size_t>(w));
    for (auto& x : s) x = (rng.next() & 1) ? 1 : -1;
    if (w == 5120)
      for (int i = 0; i < 16; ++i) s[size_t(i)] = anchor[i];
    r.widths.push_back(w);
    r.signs.push_back(std::move(s));
  }
  return r;
}

namespace {

TernaryMatrix ternarise(const std::string& name, const std::vector<float>& w, int64_t N, int64_t K, const int8_t* signs,
                        int64_t block, bool rotate) {
  TernaryMatrix t;
  t.name = name;
  t.rows = N;
  t.cols = K;
  t.folded = rotate;
  uint8_t* blocks = t.allocate(N, K);  // [N, K/128, 34]
  std::vector<double> row(static_cast<size_t>(K));
  std::vector<float> rowf(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) row[size_t(k)] = w[size_t(n * K + k)];
    if (rotate) fwht_rows_f64(row.data(), K, signs, block, false);
    for (int64_t k = 0; k < K; ++k) rowf[size_t(k)] = float(row[size_t(k)]);
    for (int64_t g = 0; g < K / 128; ++g) {
      uint32_t words[8];
      const uint16_t d = ternary_quantize_group(&rowf[size_t(g * 128)], words);
      pq2_encode_block(words, d, blocks + uint64_t(n * (K / 128) + g) * kPq2Bytes);
    }
  }
  return t;
}

}  // namespace

Model fold_and_ternarise(const FloatModel& f, const HadamardRotation& rot) {
  const ModelConfig& c = f.config;
  Model m;
  m.config = c;
  m.hadamard = rot;
  m.source_format = "make-pack";
  m.layers.resize(size_t(c.n_layers));
  const bool R = rot.enabled;
  for (const TensorSpec& s : tensor_specs(c)) {
    const std::vector<float>& w = f.tensors.at(s.hf_name);
    LayerWeights* L = s.layer >= 0 ? &m.layers[size_t(s.layer)] : nullptr;
    if (L) L->full_attention = c.full_attention[size_t(s.layer)];
    auto tern = [&]() { return ternarise(s.gguf_name, w, s.rows(), s.cols(), R ? rot.signs_for(s.cols()) : nullptr, rot.block, R); };
    auto gain = [&]() {
      std::vector<float> g = w;
      if (plus_one_norm(s.role))
        for (auto& x : g) x = 1.0f + x;  // stored (1 + w): the multiplicative gain
      return g;
    };
    auto bf16_round = [&]() {
      std::vector<float> v = w;
      for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
      return v;
    };
    switch (s.role) {
      case Role::TokenEmbd: m.embed = tern(); m.embed_inverse = R; m.embed.folded = false; break;
      case Role::Output: m.head = tern(); break;
      case Role::OutputNorm: m.out_norm = gain(); break;
      case Role::AttnNorm: L->attn_norm = gain(); break;
      case Role::PostAttnNorm: L->post_norm = gain(); break;
      case Role::FfnGate: L->gate = tern(); break;
      case Role::FfnUp: L->up = tern(); break;
      case Role::FfnDown: L->down = tern(); break;
      case Role::AttnQ: L->attn.q = tern(); break;
      case Role::AttnK: L->attn.k = tern(); break;
      case Role::AttnV: L->attn.v = tern(); break;
      case Role::AttnOutput: L->attn.o = tern(); break;
      case Role::AttnQNorm: L->attn.q_norm = gain(); break;
      case Role::AttnKNorm: L->attn.k_norm = gain(); break;
      case Role::GdnQkv: L->gdn.qkv = tern(); break;
      case Role::GdnGate: L->gdn.z = tern(); break;
      case Role::GdnOut: L->gdn.out = tern(); break;
      case Role::GdnAlpha: L->gdn.a = bf16_round(); break;
      case Role::GdnBeta: L->gdn.b = bf16_round(); break;
      case Role::GdnA: {
        L->gdn.A.resize(w.size());
        for (size_t i = 0; i < w.size(); ++i) L->gdn.A[i] = a_from_a_log(w[i]);
        break;
      }
      case Role::GdnDtBias: L->gdn.dt_bias = w; break;
      case Role::GdnConv: L->gdn.conv = w; break;
      case Role::GdnNorm: L->gdn.norm = w; break;
    }
  }
  return m;
}

FloatModel effective_float_model(const Model& m, const std::map<int64_t, std::vector<float>>& a_log) {
  FloatModel f;
  f.config = m.config;
  for (const TensorSpec& s : tensor_specs(m.config)) {
    const TernaryMatrix* t = ternary_of(m, s.role, s.layer);
    // A_log as the pack was written from it (the canonical model keeps A = -exp(A_log)).
    const std::vector<float>* v = t ? nullptr : s.role == Role::GdnA ? &a_log.at(s.layer) : &floats_of(m, s.role, s.layer);
    std::vector<float> out;
    if (t) {
      const int64_t N = t->rows, K = t->cols;
      const bool unrotate = t->folded || (s.role == Role::TokenEmbd && m.embed_inverse);
      const int8_t* signs = unrotate ? m.hadamard.signs_for(K) : nullptr;
      out.resize(size_t(N * K));
      std::vector<double> row(static_cast<size_t>(K));
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k)
          row[size_t(k)] = double(t->code(n, k) - 1) * double(fp16_to_f32(t->group_scale(n, k / 128)));
        if (unrotate) fwht_rows_f64(row.data(), K, signs, m.hadamard.block, true);
        if (!t->input_perm.empty()) {  // the matrix reads x[input_perm[i]] at column i
          std::vector<double> g(static_cast<size_t>(K));
          for (int64_t k = 0; k < K; ++k) g[size_t(t->input_perm[size_t(k)])] = row[size_t(k)];
          row = g;
        }
        for (int64_t k = 0; k < K; ++k) out[size_t(n * K + k)] = float(row[size_t(k)]);
      }
    } else {
      out = *v;
      if (plus_one_norm(s.role))
        for (auto& x : out) x = x - 1.0f;  // back to HF's zero-centred w
    }
    f.tensors[s.hf_name] = std::move(out);
  }
  return f;
}

}  // namespace bonsai
