// A float forward of the Qwen3.5 hybrid decoder written straight from HF `qwen3_5` semantics, reading the
// effective float weights make-pack writes (model.safetensors: de-quantised, UN-rotated, HF names and
// conventions: linears [N, K], norms stored as w and applied as 1 + w except linear_attn.norm (raw),
// A_log, conv1d [C, 1, Kc], grouped GDN heads). No Hadamard anywhere, dense fp32 matmuls, the CPU ops for
// the building blocks. It shares nothing with model/forward.cpp but the op library, so comparing a pack's
// forward against the forward of its own effective weights checks the whole transform chain (embedding
// inverse, every folded site, the gains and GDN conventions) independently.
#pragma once
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "util/error.h"

namespace bonsai::testing_support {

// Logits [T, V] of tokens[0..T) from an empty state.
inline std::vector<float> float_forward(const std::string& effective_dir, const std::vector<int32_t>& tokens) {
  std::ifstream cf(effective_dir + "/config.json");
  const ModelConfig c = config_from_hf(nlohmann::json::parse(cf), effective_dir + "/config.json");
  SafetensorsFile st(effective_dir + "/model.safetensors");
  auto W = [&](const std::string& name) -> const float* {
    const StTensor* t = st.find(name);
    if (!t || t->dtype != StDtype::F32) fail("float_forward: {} missing or not F32", name);
    return reinterpret_cast<const float*>(t->data);
  };
  auto plus_one = [&](const std::string& name, int64_t n) {  // HF RMSNormPlusOne: gain = 1 + w
    std::vector<float> g(static_cast<size_t>(n));
    const float* w = W(name);
    for (int64_t i = 0; i < n; ++i) g[size_t(i)] = 1.0f + w[i];
    return g;
  };
  auto linear = [](const float* w, int64_t N, int64_t K, const std::vector<float>& x, int64_t T) {
    std::vector<float> y(size_t(T * N));
    cpu::dense_matmul_f32(w, N, K, x.data(), T, y.data());
    return y;
  };
  const int64_t T = int64_t(tokens.size()), E = c.hidden, V = c.vocab;
  const float eps = c.rms_eps;
  std::vector<float> h(size_t(T * E)), x(size_t(T * E));
  const float* emb = W("model.embed_tokens.weight");
  for (int64_t t = 0; t < T; ++t)
    std::copy(emb + tokens[size_t(t)] * E, emb + (tokens[size_t(t)] + 1) * E, h.begin() + t * E);

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    cpu::rmsnorm(h.data(), T, E, plus_one(p + "input_layernorm.weight", E).data(), eps, x.data());
    std::vector<float> mix;
    if (c.full_attention[size_t(l)]) {
      const int64_t H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
      auto qg = linear(W(p + "self_attn.q_proj.weight"), 2 * H * D, E, x, T);
      auto k = linear(W(p + "self_attn.k_proj.weight"), Hkv * D, E, x, T);
      auto v = linear(W(p + "self_attn.v_proj.weight"), Hkv * D, E, x, T);
      std::vector<float> q(size_t(T * H * D)), gate(size_t(T * H * D));
      for (int64_t r = 0; r < T * H; ++r)  // view(T, H, 2D).chunk(2, -1)
        for (int64_t d = 0; d < D; ++d) {
          q[size_t(r * D + d)] = qg[size_t(r * 2 * D + d)];
          gate[size_t(r * D + d)] = qg[size_t(r * 2 * D + D + d)];
        }
      cpu::rmsnorm(q.data(), T * H, D, plus_one(p + "self_attn.q_norm.weight", D).data(), eps, q.data());
      cpu::rmsnorm(k.data(), T * Hkv, D, plus_one(p + "self_attn.k_norm.weight", D).data(), eps, k.data());
      for (int64_t t = 0; t < T; ++t) {
        cpu::rope_neox(q.data() + t * H * D, H, D, c.rope_dims, t, c.rope_theta);
        cpu::rope_neox(k.data() + t * Hkv * D, Hkv, D, c.rope_dims, t, c.rope_theta);
      }
      std::vector<float> o(size_t(T * H * D));
      cpu::attention_prefill(q.data(), k.data(), v.data(), T, 0, H, Hkv, D, float(1.0 / std::sqrt(double(D))), o.data());
      cpu::sigmoid_gate_mul(o.data(), gate.data(), T * H * D);
      mix = linear(W(p + "self_attn.o_proj.weight"), E, H * D, o, T);
    } else {
      const int64_t Nk = c.gdn_k_heads, Nv = c.gdn_v_heads, Dk = c.gdn_head_dim, Dv = Dk;
      const int64_t KD = Nk * Dk, VD = Nv * Dv, C = 2 * KD + VD, Kc = c.conv_kernel;
      auto qkv = linear(W(p + "linear_attn.in_proj_qkv.weight"), C, E, x, T);
      auto z = linear(W(p + "linear_attn.in_proj_z.weight"), VD, E, x, T);
      auto a = linear(W(p + "linear_attn.in_proj_a.weight"), Nv, E, x, T);
      auto b = linear(W(p + "linear_attn.in_proj_b.weight"), Nv, E, x, T);
      std::vector<float> conv_state(size_t((Kc - 1) * C), 0.0f), conv(size_t(T * C));
      cpu::gdn_conv(qkv.data(), conv_state.data(), W(p + "linear_attn.conv1d.weight"), T, C, Kc, conv.data());
      std::vector<float> q(size_t(T * KD)), k(size_t(T * KD)), v(size_t(T * VD));
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(conv.begin() + t * C, KD, q.begin() + t * KD);
        std::copy_n(conv.begin() + t * C + KD, KD, k.begin() + t * KD);
        std::copy_n(conv.begin() + t * C + 2 * KD, VD, v.begin() + t * VD);
      }
      cpu::l2norm_heads(q.data(), T * Nk, Dk, 1e-6f);
      cpu::l2norm_heads(k.data(), T * Nk, Dk, 1e-6f);
      for (auto& e : q) e *= float(1.0 / std::sqrt(double(Dk)));
      std::vector<float> A(static_cast<size_t>(Nv)), g(static_cast<size_t>(T * Nv)), beta(static_cast<size_t>(T * Nv));
      const float* a_log = W(p + "linear_attn.A_log");
      for (int64_t i = 0; i < Nv; ++i) A[size_t(i)] = -std::exp(a_log[i]);
      cpu::gdn_gates(a.data(), b.data(), A.data(), W(p + "linear_attn.dt_bias"), T, Nv, g.data(), beta.data());
      std::vector<float> S(size_t(Nv * Dk * Dv), 0.0f), o(size_t(T * VD));
      cpu::gdn_recurrent(S.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), T, Nk, Nv, Dk, Dv, o.data());
      cpu::gated_rmsnorm(o.data(), z.data(), W(p + "linear_attn.norm.weight"), T * Nv, Dv, eps, o.data());
      mix = linear(W(p + "linear_attn.out_proj.weight"), E, VD, o, T);
    }
    for (size_t i = 0; i < h.size(); ++i) h[i] += mix[i];
    cpu::rmsnorm(h.data(), T, E, plus_one(p + "post_attention_layernorm.weight", E).data(), eps, x.data());
    const int64_t FF = c.ffn[size_t(l)];
    auto gt = linear(W(p + "mlp.gate_proj.weight"), FF, E, x, T);
    auto up = linear(W(p + "mlp.up_proj.weight"), FF, E, x, T);
    cpu::silu_mul(gt.data(), up.data(), T * FF, gt.data());
    auto down = linear(W(p + "mlp.down_proj.weight"), E, FF, gt, T);
    for (size_t i = 0; i < h.size(); ++i) h[i] += down[i];
  }
  cpu::rmsnorm(h.data(), T, E, plus_one("model.norm.weight", E).data(), eps, x.data());
  return linear(W("lm_head.weight"), V, E, x, T);
}

}  // namespace bonsai::testing_support
