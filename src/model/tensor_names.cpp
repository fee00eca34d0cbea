#include "model/tensor_names.h"

#include <fmt/format.h>

namespace bonsai {

const char* role_name(Role r) {
  switch (r) {
    case Role::TokenEmbd: return "token_embd";
    case Role::OutputNorm: return "output_norm";
    case Role::Output: return "output";
    case Role::AttnNorm: return "attn_norm";
    case Role::PostAttnNorm: return "post_attention_norm";
    case Role::FfnGate: return "ffn_gate";
    case Role::FfnUp: return "ffn_up";
    case Role::FfnDown: return "ffn_down";
    case Role::AttnQ: return "attn_q";
    case Role::AttnK: return "attn_k";
    case Role::AttnV: return "attn_v";
    case Role::AttnOutput: return "attn_output";
    case Role::AttnQNorm: return "attn_q_norm";
    case Role::AttnKNorm: return "attn_k_norm";
    case Role::GdnQkv: return "attn_qkv";
    case Role::GdnGate: return "attn_gate";
    case Role::GdnConv: return "ssm_conv1d";
    case Role::GdnDtBias: return "ssm_dt.bias";
    case Role::GdnA: return "ssm_a";
    case Role::GdnAlpha: return "ssm_alpha";
    case Role::GdnBeta: return "ssm_beta";
    case Role::GdnNorm: return "ssm_norm";
    case Role::GdnOut: return "ssm_out";
  }
  return "?";
}

std::vector<TensorSpec> tensor_specs(const ModelConfig& c) {
  using K = TensorKind;
  const uint64_t E = uint64_t(c.hidden), V = uint64_t(c.vocab);
  std::vector<TensorSpec> s;
  auto add = [&](Role r, int64_t layer, K kind, std::string gguf, std::string hf, std::vector<uint64_t> ne,
                 bool required = true) {
    s.push_back({r, layer, kind, std::move(gguf), std::move(hf), std::move(ne), required});
  };
  add(Role::TokenEmbd, -1, K::Ternary, "token_embd.weight", "model.embed_tokens.weight", {E, V});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string g = fmt::format("blk.{}.", i), h = fmt::format("model.layers.{}.", i);
    const uint64_t FF = uint64_t(c.ffn[size_t(i)]);
    add(Role::AttnNorm, i, K::Vector, g + "attn_norm.weight", h + "input_layernorm.weight", {E});
    if (c.full_attention[size_t(i)]) {
      const uint64_t Dh = uint64_t(c.head_dim);
      add(Role::AttnQ, i, K::Ternary, g + "attn_q.weight", h + "self_attn.q_proj.weight", {E, uint64_t(c.q_rows())});
      add(Role::AttnK, i, K::Ternary, g + "attn_k.weight", h + "self_attn.k_proj.weight", {E, uint64_t(c.kv_rows())});
      add(Role::AttnV, i, K::Ternary, g + "attn_v.weight", h + "self_attn.v_proj.weight", {E, uint64_t(c.kv_rows())});
      add(Role::AttnOutput, i, K::Ternary, g + "attn_output.weight", h + "self_attn.o_proj.weight", {uint64_t(c.attn_out()), E});
      add(Role::AttnQNorm, i, K::Vector, g + "attn_q_norm.weight", h + "self_attn.q_norm.weight", {Dh});
      add(Role::AttnKNorm, i, K::Vector, g + "attn_k_norm.weight", h + "self_attn.k_norm.weight", {Dh});
    } else {
      const uint64_t C = uint64_t(c.gdn_conv_channels()), Nv = uint64_t(c.gdn_v_heads), VD = uint64_t(c.gdn_value_dim());
      add(Role::GdnQkv, i, K::Ternary, g + "attn_qkv.weight", h + "linear_attn.in_proj_qkv.weight", {E, C});
      add(Role::GdnGate, i, K::Ternary, g + "attn_gate.weight", h + "linear_attn.in_proj_z.weight", {E, VD});
      add(Role::GdnConv, i, K::Conv, g + "ssm_conv1d.weight", h + "linear_attn.conv1d.weight", {uint64_t(c.conv_kernel), C});
      add(Role::GdnDtBias, i, K::Vector, g + "ssm_dt.bias", h + "linear_attn.dt_bias", {Nv});
      add(Role::GdnA, i, K::Vector, g + "ssm_a", h + "linear_attn.A_log", {Nv});
      add(Role::GdnAlpha, i, K::Dense, g + "ssm_alpha.weight", h + "linear_attn.in_proj_a.weight", {E, Nv});
      add(Role::GdnBeta, i, K::Dense, g + "ssm_beta.weight", h + "linear_attn.in_proj_b.weight", {E, Nv});
      add(Role::GdnNorm, i, K::Vector, g + "ssm_norm.weight", h + "linear_attn.norm.weight", {uint64_t(c.gdn_head_dim)});
      add(Role::GdnOut, i, K::Ternary, g + "ssm_out.weight", h + "linear_attn.out_proj.weight", {VD, E});
    }
    add(Role::PostAttnNorm, i, K::Vector, g + "post_attention_norm.weight", h + "post_attention_layernorm.weight", {E});
    add(Role::FfnGate, i, K::Ternary, g + "ffn_gate.weight", h + "mlp.gate_proj.weight", {E, FF});
    add(Role::FfnUp, i, K::Ternary, g + "ffn_up.weight", h + "mlp.up_proj.weight", {E, FF});
    add(Role::FfnDown, i, K::Ternary, g + "ffn_down.weight", h + "mlp.down_proj.weight", {FF, E});
  }
  add(Role::OutputNorm, -1, K::Vector, "output_norm.weight", "model.norm.weight", {E});
  add(Role::Output, -1, K::Ternary, "output.weight", "lm_head.weight", {E, V}, !c.tied_embeddings);
  return s;
}

const TensorSpec* find_spec(const std::vector<TensorSpec>& specs, const std::string& name) {
  auto strip = [](std::string n) {
    for (const char* p : {"model.language_model.", "language_model."}) {
      const std::string ps(p);
      if (n.rfind(ps, 0) == 0) {
        n = n.substr(ps.size());
        // "model.language_model.layers.0..." is HF's VL naming of "model.layers.0..."
        if (ps == "model.language_model.") n = "model." + n;
        break;
      }
    }
    return n;
  };
  const std::string n = strip(name);
  for (const TensorSpec& s : specs) {
    if (n == s.gguf_name || n == s.hf_name) return &s;
    if (n + ".weight" == s.gguf_name || n + ".weight" == s.hf_name) return &s;
  }
  return nullptr;
}

}  // namespace bonsai
