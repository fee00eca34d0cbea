// The loop that ties writer conventions, reader conventions and the fold together: the same tiny model
// written as GGUF PQ2_0, GGUF PTQ1_0 and the MLX folder loads to byte-identical canonical weights, and
// those weights de-quantised and un-rotated (with the reference backend's transform, not make-pack's)
// equal the effective float weights make-pack wrote.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/ref/ops.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "format/ternary_codec.h"
#include "model/pack.h"
#include "model/tensor_names.h"
#include "tiny_packs.h"
#include "util/half.h"

using namespace bonsai;
using bonsai::testing_support::tiny_packs;

TEST(PackRoundTrip, AllFormatsLoadToIdenticalCanonicalWeights) {
  const Model a = load_model(tiny_packs().pq2);
  const Model b = load_model(tiny_packs().ptq1);
  const Model c = load_model(tiny_packs().mlx);
  EXPECT_EQ(a.source_format, "gguf-pq2_0");
  EXPECT_EQ(b.source_format, "gguf-ptq1_0");
  EXPECT_EQ(c.source_format, "mlx");
  std::string diff;
  EXPECT_TRUE(canonical_equal(a, b, &diff)) << "PQ2_0 vs PTQ1_0 differ at " << diff;
  EXPECT_TRUE(canonical_equal(a, c, &diff)) << "PQ2_0 vs MLX differ at " << diff;
  // The structure the tiny preset promises.
  EXPECT_TRUE(a.hadamard.enabled);
  EXPECT_EQ(a.hadamard.block, 1024);
  EXPECT_TRUE(a.embed_inverse);
  EXPECT_TRUE(a.head.folded);
  EXPECT_EQ(a.config.n_heads / a.config.n_kv_heads, 6);
  EXPECT_EQ(a.config.gdn_v_heads / a.config.gdn_k_heads, 3);
  EXPECT_GE(a.config.n_full_attention(), 1);
  for (const TernaryMatrix* t : a.ternary_matrices())
    if (t != &a.embed) EXPECT_TRUE(t->folded) << t->name;
}

// Zero copy: a PQ2_0 load views the mapped file's blocks in place (the tiled GDN rows through a row map),
// and the model keeps the mapping alive after the Pack is gone. PTQ1_0 and MLX are transcoded into owned blocks.
TEST(PackRoundTrip, Pq2LoadIsAViewThatOutlivesThePack) {
  auto pack = std::make_unique<Pack>(open_pack(tiny_packs().pq2));
  Model m = load_model(*pack);
  int tiled = 0;
  for (const TernaryMatrix* t : m.ternary_matrices()) {
    const GgufTensorInfo* info = pack->gguf->find_tensor(t == &m.head && m.config.tied_embeddings ? "token_embd.weight" : t->name);
    ASSERT_NE(info, nullptr) << t->name;
    EXPECT_FALSE(t->owned) << t->name << " was copied";
    EXPECT_EQ(t->blocks, info->data) << t->name << " is not the file's bytes";
    EXPECT_EQ(t->bytes(), info->nbytes) << t->name;
    if (!t->row_runs.empty()) {
      ++tiled;
      // Only the tensors whose V rows the converter tiled carry a row map.
      EXPECT_TRUE(t->name.find("attn_qkv") != std::string::npos || t->name.find("attn_gate") != std::string::npos) << t->name;
    }
  }
  int gdn_layers = 0;
  for (const LayerWeights& l : m.layers) gdn_layers += !l.full_attention;
  EXPECT_EQ(tiled, 2 * gdn_layers);  // qkv and z of every GDN layer
  pack.reset();  // the GgufFile and its handle on the mapping are gone; the model's views still read
  const Model b = load_model(tiny_packs().ptq1);
  const Model c = load_model(tiny_packs().mlx);
  std::string diff;
  EXPECT_TRUE(canonical_equal(m, b, &diff)) << "after the pack closed, PQ2_0 vs PTQ1_0 differ at " << diff;
  for (const TernaryMatrix* t : b.ternary_matrices()) EXPECT_TRUE(t->owned && t->row_runs.empty()) << t->name;
  for (const TernaryMatrix* t : c.ternary_matrices()) EXPECT_TRUE(t->owned && t->row_runs.empty()) << t->name;
  // A copy of the model shares the storage (no weight copy) and stays valid on its own.
  Model copy = m;
  m = Model{};
  EXPECT_TRUE(canonical_equal(copy, c, &diff)) << diff;
}

TEST(PackRoundTrip, GgufHoldsGdnHeadsTiledAndNormsPlusOne) {
  // Read the GGUF bytes directly (not through the loader) and check the converter conventions against
  // the MLX file, which holds HF order: V rows of attn_qkv are tiled, ssm_a = -exp(A_log).
  GgufFile g(tiny_packs().pq2);
  MlxPack m(tiny_packs().mlx);
  const Model canon = load_model(tiny_packs().mlx);
  const ModelConfig& c = canon.config;
  const int64_t Nk = c.gdn_k_heads, Nv = c.gdn_v_heads, E = c.hidden;
  // ssm_alpha (BF16 [E, Nv] in ne order = Nv rows of E): file row t holds grouped head (t%Nk)*rep + t/Nk.
  const GgufTensorInfo* alpha = g.find_tensor("blk.0.ssm_alpha.weight");
  ASSERT_NE(alpha, nullptr);
  ASSERT_EQ(alpha->type, ggml_type::BF16);
  const int64_t rep = Nv / Nk;
  for (int64_t t = 0; t < Nv; ++t) {
    const int64_t grouped = (t % Nk) * rep + t / Nk;
    uint16_t h;
    std::memcpy(&h, alpha->data + 2 * (t * E + 5), 2);
    EXPECT_EQ(bf16_to_f32(h), canon.layers[0].gdn.a[size_t(grouped * E + 5)]) << "tiled row " << t;
  }
  // ssm_a = -exp(A_log) against the MLX A_log, in tiled order.
  const GgufTensorInfo* ssm_a = g.find_tensor("blk.0.ssm_a");
  const StTensor* a_log = m.find("language_model.model.layers.0.linear_attn.A_log");
  ASSERT_TRUE(ssm_a && a_log);
  for (int64_t t = 0; t < Nv; ++t) {
    const int64_t grouped = (t % Nk) * rep + t / Nk;
    float sa, al;
    std::memcpy(&sa, ssm_a->data + 4 * t, 4);
    std::memcpy(&al, a_log->data + 4 * grouped, 4);
    EXPECT_EQ(sa, -std::exp(al));
  }
  // +1 norms: the stored gain is 1 + w with w drawn in [-0.4, 0.4], so every entry is in [0.6, 1.4].
  const GgufTensorInfo* n = g.find_tensor("blk.0.attn_norm.weight");
  for (int64_t i = 0; i < E; ++i) {
    float v;
    std::memcpy(&v, n->data + 4 * i, 4);
    EXPECT_GE(v, 0.59f);
    EXPECT_LE(v, 1.41f);
  }
}

TEST(PackRoundTrip, CanonicalWeightsUnrotatedEqualEffectiveFloatWeights) {
  const Model m = load_model(tiny_packs().pq2);
  SafetensorsFile eff(tiny_packs().effective + "/model.safetensors");
  int checked = 0;
  for (const TensorSpec& s : tensor_specs(m.config)) {
    const StTensor* t = eff.find(s.hf_name);
    ASSERT_NE(t, nullptr) << s.hf_name;
    ASSERT_EQ(t->dtype, StDtype::F32);
    const float* want = reinterpret_cast<const float*>(t->data);
    if (s.kind != TensorKind::Ternary) continue;
    const TernaryMatrix* w = ternary_of(m, s.role, s.layer);
    ASSERT_NE(w, nullptr) << s.hf_name;
    const int64_t K = w->cols;
    std::vector<float> row(static_cast<size_t>(K));
    // Rows spread over the matrix (the whole of every matrix would take long in debug builds).
    for (int64_t r = 0; r < w->rows; r += std::max<int64_t>(1, w->rows / 37)) {
      ref::ternary_dequant_row(w->row_blocks(r), K, 0, row.data());
      // Folded linear: stored w' = R w, so w = R^T w' = S H w' / sqrt(n) (the inverse transform).
      ref::hadamard_inverse(row.data(), 1, K, m.hadamard.signs_for(K), m.hadamard.block);
      double max_err = 0, max_abs = 0;
      for (int64_t k = 0; k < K; ++k) {
        max_err = std::max(max_err, std::fabs(double(row[size_t(k)]) - double(want[r * K + k])));
        max_abs = std::max(max_abs, std::fabs(double(want[r * K + k])));
      }
      ASSERT_LE(max_err, 1e-6 * max_abs + 1e-9) << s.hf_name << " row " << r;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(PackRoundTrip, EffectiveNormsAreZeroCentredHfWeights) {
  const Model m = load_model(tiny_packs().mlx);
  SafetensorsFile eff(tiny_packs().effective + "/model.safetensors");
  const StTensor* n = eff.find("model.layers.0.input_layernorm.weight");
  const StTensor* sn = eff.find("model.layers.0.linear_attn.norm.weight");
  ASSERT_TRUE(n && sn);
  const float* w = reinterpret_cast<const float*>(n->data);
  const float* ws = reinterpret_cast<const float*>(sn->data);
  for (int64_t i = 0; i < m.config.hidden; ++i) EXPECT_EQ(1.0f + w[i], m.layers[0].attn_norm[size_t(i)]);
  for (int64_t i = 0; i < m.config.gdn_head_dim; ++i) EXPECT_EQ(ws[i], m.layers[0].gdn.norm[size_t(i)]);  // raw gain
}
