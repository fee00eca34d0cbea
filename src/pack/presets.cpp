#include "pack/presets.h"

#include "util/error.h"

namespace bonsai {

namespace {

ModelConfig qwen35_config(int64_t layers, int64_t E, int64_t FF, int64_t H, int64_t Hkv, int64_t Dh, int64_t Nk, int64_t Nv,
                          int64_t vocab, int64_t ctx, std::vector<int32_t> sections) {
  ModelConfig c;
  c.n_layers = layers;
  c.hidden = E;
  c.ffn.assign(size_t(layers), FF);
  c.n_heads = H;
  c.n_kv_heads = Hkv;
  c.head_dim = Dh;
  c.value_dim = Dh;
  c.rms_eps = 1e-6f;
  c.rope_dims = Dh / 4;  // partial_rotary_factor 0.25
  c.rope_theta = 1e7f;
  c.rope_sections = std::move(sections);
  c.conv_kernel = 4;
  c.gdn_k_heads = Nk;
  c.gdn_v_heads = Nv;
  c.gdn_head_dim = 128;
  c.gdn_inner = Nv * 128;
  c.full_attention_interval = 4;
  for (int64_t i = 0; i < layers; ++i) c.full_attention.push_back((i + 1) % 4 == 0);
  c.vocab = vocab;
  c.context_length = ctx;
  c.tied_embeddings = false;
  return c;
}

}  // namespace

PackPreset pack_preset(const std::string& name) {
  if (name == "tiny") {
    // The real structure at a few MB: block-1024 Hadamard over every width (1024, 2048, 3072), three GDN
    // layers then one full-attention layer, GQA ratio 6 (H 12 / Hkv 2), GVA ratio 3 (Nv 24 / Nk 8),
    // partial RoPE on 64 of 256 head dims, untied head. H*Dh = 3072 and Nv*Dv = 3072 are whole blocks.
    return {"tiny", qwen35_config(4, 1024, 2048, 12, 2, 256, 8, 24, 0, 8192, {11, 11, 10, 0}), 1024, true};
  }
  if (name == "27b") {
    // Ternary-Bonsai-2-27B: FACTS section 1-3.
    return {"27b", qwen35_config(64, 5120, 17408, 24, 4, 256, 16, 48, 248320, 262144, {11, 11, 10, 0}), 1024, false};
  }
  fail("unknown preset '{}': known presets are 'tiny' and '27b'", name);
}

}  // namespace bonsai
