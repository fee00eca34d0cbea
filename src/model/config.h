// ModelConfig: the hyperparameters of a Qwen3.5-architecture hybrid decoder (Gated DeltaNet layers +
// gated full-attention layers), read from the `qwen35.*` GGUF keys or the MLX/HF `text_config`.
// Nothing here is specific to the 27B: every number comes from the pack.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bonsai {

class GgufFile;
class GgufWriter;

struct ModelConfig {
  std::string architecture = "qwen35";
  int64_t n_layers = 0;          // block_count
  int64_t hidden = 0;            // embedding_length (E)
  std::vector<int64_t> ffn;      // feed_forward_length per layer (FF)
  int64_t n_heads = 0;           // attention.head_count (H)
  int64_t n_kv_heads = 0;        // attention.head_count_kv (Hkv)
  int64_t head_dim = 0;          // attention.key_length (Dh)
  int64_t value_dim = 0;         // attention.value_length
  float rms_eps = 1e-6f;
  int64_t rope_dims = 0;         // rotary dims (first rope_dims of each head, NEOX pairs)
  float rope_theta = 10000.f;
  std::vector<int32_t> rope_sections;  // mRoPE sections (text positions reduce to plain RoPE)
  int64_t conv_kernel = 4;       // ssm.conv_kernel
  int64_t gdn_k_heads = 0;       // ssm.group_count (Nk)
  int64_t gdn_v_heads = 0;       // ssm.time_step_rank (Nv)
  int64_t gdn_head_dim = 0;      // ssm.state_size (Dk = Dv)
  int64_t gdn_inner = 0;         // ssm.inner_size (Nv * Dv)
  int64_t full_attention_interval = 4;
  std::vector<bool> full_attention;  // per layer
  int64_t vocab = 0;
  int64_t context_length = 0;
  bool tied_embeddings = false;

  // Derived sizes.
  int64_t q_rows() const { return 2 * n_heads * head_dim; }   // query | gate interleaved per head
  int64_t kv_rows() const { return n_kv_heads * head_dim; }
  int64_t attn_out() const { return n_heads * value_dim; }
  int64_t gdn_key_dim() const { return gdn_k_heads * gdn_head_dim; }
  int64_t gdn_value_dim() const { return gdn_v_heads * gdn_head_dim; }
  int64_t gdn_conv_channels() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  int64_t n_full_attention() const;
  // Throws Error naming `source` and the field if the shape is inconsistent (zero sizes, H % Hkv,
  // Nv % Nk, inner != Nv * Dk, rope_dims > head_dim or odd, ...).
  void validate(const std::string& source) const;
};

ModelConfig config_from_gguf(const GgufFile& f);
// `text_config` (or a flat HF config); `source` names the file for messages.
ModelConfig config_from_hf(const nlohmann::json& text_config, const std::string& source);
// The `qwen35.*` keys (and general.architecture) as the real converter writes them.
void config_to_gguf(const ModelConfig& c, GgufWriter& w);
// HF `Qwen3_5TextConfig` fields (what transformers needs to build Qwen3_5ForCausalLM).
nlohmann::json config_to_hf(const ModelConfig& c);

}  // namespace bonsai
