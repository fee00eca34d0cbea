#include "model/pack_report.h"

#include <algorithm>
#include <map>

namespace bonsai {

namespace {

// Bytes one source occupies in the file (MLX ternary: words + scales + biases).
uint64_t source_bytes(const TensorSource& s) {
  uint64_t b = s.nbytes;
  if (s.mlx_scales) b += s.mlx_scales->nbytes;
  if (s.mlx_biases) b += s.mlx_biases->nbytes;
  return b;
}

std::string type_name(const Pack& pack, const TensorSource& s) {
  if (pack.gguf) return ggml_type_name(s.ggml_type);
  if (s.mlx_scales) return "U32 2-bit affine (words+scales+biases)";
  return st_dtype_name(s.mlx_dtype);
}

}  // namespace

nlohmann::ordered_json inspect_pack(const Pack& pack, const PackCheck& pc) {
  nlohmann::ordered_json j;
  j["path"] = pack.path;
  j["format"] = pack.format_name();
  if (pack.gguf) j["gguf_version"] = pack.gguf->version();
  j["file_bytes"] = pack.file_bytes;
  if (pc.config_ok) {
    const ModelConfig& c = pc.config;
    j["architecture"] = c.architecture;
    j["hyperparameters"] = {
        {"block_count", c.n_layers}, {"embedding_length", c.hidden}, {"feed_forward_length", c.ffn.empty() ? 0 : c.ffn[0]},
        {"head_count", c.n_heads}, {"head_count_kv", c.n_kv_heads}, {"head_dim", c.head_dim},
        {"rms_eps", c.rms_eps}, {"rope_dims", c.rope_dims}, {"rope_theta", c.rope_theta},
        {"rope_sections", c.rope_sections}, {"ssm_conv_kernel", c.conv_kernel}, {"ssm_k_heads", c.gdn_k_heads},
        {"ssm_v_heads", c.gdn_v_heads}, {"ssm_head_dim", c.gdn_head_dim}, {"ssm_inner", c.gdn_inner},
        {"full_attention_interval", c.full_attention_interval}, {"vocab", c.vocab},
        {"context_length", c.context_length}, {"tied_embeddings", c.tied_embeddings}};
    std::string kinds;
    for (bool fa : c.full_attention) kinds += fa ? 'A' : 'G';
    j["layers"] = {{"pattern", kinds}, {"full_attention", c.n_full_attention()},
                   {"gated_deltanet", c.n_layers - c.n_full_attention()}};
  }
  // Inventory by type.
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (count, bytes)
  uint64_t total = 0, embed_bytes = 0, embed_rows = 1;
  for (const TensorSource& s : pc.sources) {
    auto& e = by_type[type_name(pack, s)];
    e.first += 1;
    e.second += source_bytes(s);
    total += source_bytes(s);
    if (s.spec->role == Role::TokenEmbd) {
      embed_bytes = source_bytes(s);
      embed_rows = uint64_t(std::max<int64_t>(1, s.spec->rows()));
    }
  }
  nlohmann::ordered_json inv = nlohmann::ordered_json::array();
  for (const auto& [t, cb] : by_type) inv.push_back({{"type", t}, {"count", cb.first}, {"bytes", cb.second}});
  j["tensors"] = {{"count", pc.sources.size()}, {"bytes", total}, {"by_type", inv}};
  // Per decoded token: every weight except the embedding table, of which one row is read.
  j["bytes_per_token"] = total - embed_bytes + embed_bytes / embed_rows;
  // The contract.
  const HadamardContract& h = pc.contract;
  nlohmann::ordered_json hj;
  hj["present"] = h.present;
  if (h.present) {
    hj["version"] = h.version;
    hj["block_size"] = h.block_size;
    hj["transform"] = h.transform;
    hj["axis"] = h.axis;
    hj["sign_mode"] = h.sign_mode;
    nlohmann::ordered_json widths = nlohmann::ordered_json::array();
    for (int64_t w : h.sign_widths) {
      int64_t neg = 0;
      if (h.signs.count(w)) neg = std::count(h.signs.at(w).begin(), h.signs.at(w).end(), int8_t(-1));
      widths.push_back({{"width", w}, {"blocks", h.block_size ? w / int64_t(h.block_size) : 0}, {"negative", neg}});
    }
    hj["sign_widths"] = widths;
    hj["folded"] = h.weight_names.size();
    hj["inverse"] = h.inverse_weight_names.size();
    if (h.has_gdn_v_grouped) hj["gdn_v_grouped"] = h.gdn_v_grouped;
    int64_t unfolded_ternary = 0;
    for (const TensorSource& s : pc.sources)
      if (s.spec->kind == TensorKind::Ternary && !s.folded && !s.inverse) ++unfolded_ternary;
    hj["unrotated_ternary"] = unfolded_ternary;
  }
  j["hadamard"] = hj;
  j["valid"] = pc.valid();
  j["problems"] = pc.problems;
  j["warnings"] = pc.warnings;
  return j;
}

}  // namespace bonsai
