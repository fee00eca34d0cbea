#include "model/config.h"

#include <algorithm>
#include <cmath>

#include "format/gguf.h"
#include "util/error.h"

namespace bonsai {

int64_t ModelConfig::n_full_attention() const {
  return std::count(full_attention.begin(), full_attention.end(), true);
}

void ModelConfig::validate(const std::string& src) const {
  auto need = [&](bool ok, const char* field, const std::string& why) {
    if (!ok) fail("{}: model config field '{}' {}", src, field, why);
  };
  need(n_layers > 0 && n_layers < 100000, "block_count", fmt::format("= {}, expected 1..99999", n_layers));
  need(hidden > 0 && hidden % 128 == 0, "embedding_length", fmt::format("= {}, expected a positive multiple of 128", hidden));
  need(int64_t(ffn.size()) == n_layers, "feed_forward_length", fmt::format("has {} entries, expected {}", ffn.size(), n_layers));
  for (int64_t f : ffn) need(f > 0 && f % 128 == 0, "feed_forward_length", fmt::format("= {}, expected a positive multiple of 128", f));
  need(n_heads > 0, "attention.head_count", "must be positive");
  need(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention.head_count_kv",
       fmt::format("= {}, expected a divisor of head_count {}", n_kv_heads, n_heads));
  need(head_dim > 0 && head_dim % 2 == 0, "attention.key_length", fmt::format("= {}, expected a positive even number", head_dim));
  need(value_dim == head_dim, "attention.value_length", fmt::format("= {}, expected key_length {}", value_dim, head_dim));
  need(rope_dims > 0 && rope_dims <= head_dim && rope_dims % 2 == 0, "rope.dimension_count",
       fmt::format("= {}, expected an even number in 2..{}", rope_dims, head_dim));
  need(rms_eps > 0 && rms_eps < 1, "attention.layer_norm_rms_epsilon", fmt::format("= {}, expected in (0, 1)", rms_eps));
  need(rope_theta > 0, "rope.freq_base", "must be positive");
  need(conv_kernel >= 2 && conv_kernel <= 16, "ssm.conv_kernel", fmt::format("= {}, expected 2..16", conv_kernel));
  need(gdn_k_heads > 0, "ssm.group_count", "must be positive");
  need(gdn_v_heads > 0 && gdn_v_heads % gdn_k_heads == 0, "ssm.time_step_rank",
       fmt::format("= {}, expected a multiple of ssm.group_count {}", gdn_v_heads, gdn_k_heads));
  need(gdn_head_dim > 0 && gdn_head_dim % 2 == 0, "ssm.state_size", "must be a positive even number");
  need(gdn_inner == gdn_v_heads * gdn_head_dim, "ssm.inner_size",
       fmt::format("= {}, expected time_step_rank * state_size = {}", gdn_inner, gdn_v_heads * gdn_head_dim));
  need(int64_t(full_attention.size()) == n_layers, "full_attention_interval", "layer kinds do not cover every layer");
  need(vocab > 0, "vocab", "must be positive");
}

ModelConfig config_from_gguf(const GgufFile& f) {
  const std::string arch = f.get_str("general.architecture");
  if (arch != "qwen35")
    fail("{}: general.architecture is '{}', expected 'qwen35' (the Bonsai 2 / Qwen3.5 hybrid decoder)", f.path(), arch);
  const std::string p = arch + ".";
  ModelConfig c;
  c.architecture = arch;
  c.n_layers = f.get_u32(p + "block_count");
  c.hidden = f.get_u32(p + "embedding_length");
  const GgufValue* ff = f.find(p + "feed_forward_length");
  if (ff && ff->type == GgufType::ARRAY) {
    for (int64_t v : f.get_arr_int(p + "feed_forward_length")) c.ffn.push_back(v);
  } else {
    c.ffn.assign(size_t(c.n_layers), f.get_u32(p + "feed_forward_length"));
  }
  c.n_heads = f.get_u32(p + "attention.head_count");
  c.n_kv_heads = f.opt_u32(p + "attention.head_count_kv").value_or(uint32_t(c.n_heads));
  c.head_dim = f.opt_u32(p + "attention.key_length").value_or(uint32_t(c.hidden / std::max<int64_t>(c.n_heads, 1)));
  c.value_dim = f.opt_u32(p + "attention.value_length").value_or(uint32_t(c.head_dim));
  c.rms_eps = f.get_f32(p + "attention.layer_norm_rms_epsilon");
  c.rope_dims = f.opt_u32(p + "rope.dimension_count").value_or(uint32_t(c.head_dim));
  c.rope_theta = f.opt_f32(p + "rope.freq_base").value_or(10000.f);
  for (int64_t v : f.get_arr_int(p + "rope.dimension_sections")) c.rope_sections.push_back(int32_t(v));
  c.conv_kernel = f.get_u32(p + "ssm.conv_kernel");
  c.gdn_inner = f.get_u32(p + "ssm.inner_size");
  c.gdn_head_dim = f.get_u32(p + "ssm.state_size");
  c.gdn_v_heads = f.get_u32(p + "ssm.time_step_rank");
  c.gdn_k_heads = f.get_u32(p + "ssm.group_count");
  c.full_attention_interval = f.get_u32(p + "full_attention_interval");
  if (c.full_attention_interval <= 0) fail("{}: key '{}full_attention_interval' is 0, expected >= 1", f.path(), p);
  for (int64_t i = 0; i < c.n_layers; ++i) c.full_attention.push_back((i + 1) % c.full_attention_interval == 0);
  c.context_length = f.get_u32(p + "context_length");
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) fail("{}: tensor 'token_embd.weight' is missing", f.path());
  if (emb->ne.size() != 2) fail("{}: tensor 'token_embd.weight' has {} dims, expected 2 [E, vocab]", f.path(), emb->ne.size());
  c.vocab = int64_t(emb->ne[1]);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.validate(f.path());
  return c;
}

namespace {
int64_t jint(const nlohmann::json& j, const char* key, const std::string& src) {
  if (!j.contains(key)) fail("{}: text_config field '{}' is missing", src, key);
  if (!j[key].is_number_integer()) fail("{}: text_config field '{}' is {}, expected an integer", src, key, j[key].type_name());
  return j[key].get<int64_t>();
}
int64_t jint_or(const nlohmann::json& j, const char* key, int64_t dflt, const std::string& src) {
  return j.contains(key) && !j[key].is_null() ? jint(j, key, src) : dflt;
}
double jnum_or(const nlohmann::json& j, const char* key, double dflt, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number()) fail("{}: text_config field '{}' is {}, expected a number", src, key, j[key].type_name());
  return j[key].get<double>();
}
}  // namespace

ModelConfig config_from_hf(const nlohmann::json& tc, const std::string& src) {
  if (!tc.is_object()) fail("{}: text_config is not an object", src);
  ModelConfig c;
  c.n_layers = jint(tc, "num_hidden_layers", src);
  c.hidden = jint(tc, "hidden_size", src);
  c.ffn.assign(size_t(std::max<int64_t>(c.n_layers, 0)), jint(tc, "intermediate_size", src));
  c.n_heads = jint(tc, "num_attention_heads", src);
  c.n_kv_heads = jint_or(tc, "num_key_value_heads", c.n_heads, src);
  c.head_dim = jint_or(tc, "head_dim", c.n_heads ? c.hidden / c.n_heads : 0, src);
  c.value_dim = c.head_dim;
  c.rms_eps = float(jnum_or(tc, "rms_norm_eps", 1e-6, src));
  double partial = jnum_or(tc, "partial_rotary_factor", -1, src);
  double theta = jnum_or(tc, "rope_theta", 10000.0, src);
  if (tc.contains("rope_parameters") && tc["rope_parameters"].is_object()) {
    const auto& rp = tc["rope_parameters"];
    theta = jnum_or(rp, "rope_theta", theta, src);
    if (partial < 0) partial = jnum_or(rp, "partial_rotary_factor", -1, src);
    if (rp.contains("mrope_section") && rp["mrope_section"].is_array())
      for (const auto& v : rp["mrope_section"]) c.rope_sections.push_back(v.get<int32_t>());
  }
  if (partial < 0) partial = 0.25;  // the Qwen3.5 default
  c.rope_theta = float(theta);
  c.rope_dims = int64_t(std::llround(double(c.head_dim) * partial));
  c.conv_kernel = jint_or(tc, "linear_conv_kernel_dim", 4, src);
  c.gdn_k_heads = jint(tc, "linear_num_key_heads", src);
  c.gdn_v_heads = jint(tc, "linear_num_value_heads", src);
  c.gdn_head_dim = jint_or(tc, "linear_key_head_dim", 128, src);
  const int64_t vdim = jint_or(tc, "linear_value_head_dim", c.gdn_head_dim, src);
  if (vdim != c.gdn_head_dim)
    fail("{}: linear_value_head_dim {} differs from linear_key_head_dim {}; bonsai expects them equal", src, vdim, c.gdn_head_dim);
  c.gdn_inner = c.gdn_v_heads * c.gdn_head_dim;
  if (tc.contains("layer_types") && tc["layer_types"].is_array()) {
    for (const auto& t : tc["layer_types"]) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s == "full_attention") c.full_attention.push_back(true);
      else if (s == "linear_attention") c.full_attention.push_back(false);
      else fail("{}: text_config.layer_types has '{}', expected 'full_attention' or 'linear_attention'", src, t.dump());
    }
    c.full_attention_interval = 0;
    for (size_t i = 0; i < c.full_attention.size(); ++i)
      if (c.full_attention[i]) { c.full_attention_interval = int64_t(i) + 1; break; }
  } else {
    c.full_attention_interval = jint_or(tc, "full_attention_interval", 4, src);
    if (c.full_attention_interval <= 0) fail("{}: full_attention_interval must be >= 1", src);
    for (int64_t i = 0; i < c.n_layers; ++i) c.full_attention.push_back((i + 1) % c.full_attention_interval == 0);
  }
  c.vocab = jint(tc, "vocab_size", src);
  c.context_length = jint_or(tc, "max_position_embeddings", 262144, src);
  c.tied_embeddings = tc.value("tie_word_embeddings", false);
  c.validate(src);
  return c;
}

void config_to_gguf(const ModelConfig& c, GgufWriter& w) {
  const std::string p = c.architecture + ".";
  w.set("general.architecture", GgufValue::str(c.architecture));
  w.set(p + "context_length", GgufValue::u32(uint32_t(c.context_length)));
  w.set(p + "embedding_length", GgufValue::u32(uint32_t(c.hidden)));
  w.set(p + "block_count", GgufValue::u32(uint32_t(c.n_layers)));
  const bool uniform_ffn = std::all_of(c.ffn.begin(), c.ffn.end(), [&](int64_t v) { return v == c.ffn[0]; });
  if (uniform_ffn) {
    w.set(p + "feed_forward_length", GgufValue::u32(uint32_t(c.ffn[0])));
  } else {
    std::vector<uint32_t> v(c.ffn.begin(), c.ffn.end());
    w.set(p + "feed_forward_length", GgufValue::arr_u32(v));
  }
  w.set(p + "attention.head_count", GgufValue::u32(uint32_t(c.n_heads)));
  w.set(p + "attention.head_count_kv", GgufValue::u32(uint32_t(c.n_kv_heads)));
  w.set(p + "attention.key_length", GgufValue::u32(uint32_t(c.head_dim)));
  w.set(p + "attention.value_length", GgufValue::u32(uint32_t(c.value_dim)));
  w.set(p + "attention.layer_norm_rms_epsilon", GgufValue::f32(c.rms_eps));
  w.set(p + "rope.dimension_count", GgufValue::u32(uint32_t(c.rope_dims)));
  w.set(p + "rope.dimension_sections", GgufValue::arr_i32(c.rope_sections));
  w.set(p + "rope.freq_base", GgufValue::f32(c.rope_theta));
  w.set(p + "ssm.conv_kernel", GgufValue::u32(uint32_t(c.conv_kernel)));
  w.set(p + "ssm.inner_size", GgufValue::u32(uint32_t(c.gdn_inner)));
  w.set(p + "ssm.state_size", GgufValue::u32(uint32_t(c.gdn_head_dim)));
  w.set(p + "ssm.time_step_rank", GgufValue::u32(uint32_t(c.gdn_v_heads)));
  w.set(p + "ssm.group_count", GgufValue::u32(uint32_t(c.gdn_k_heads)));
  w.set(p + "full_attention_interval", GgufValue::u32(uint32_t(c.full_attention_interval)));
}

nlohmann::json config_to_hf(const ModelConfig& c) {
  nlohmann::json j;
  j["model_type"] = "qwen3_5_text";
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.ffn.empty() ? 0 : c.ffn[0];
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.context_length;
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["attention_bias"] = false;
  j["linear_conv_kernel_dim"] = c.conv_kernel;
  j["linear_key_head_dim"] = c.gdn_head_dim;
  j["linear_value_head_dim"] = c.gdn_head_dim;
  j["linear_num_key_heads"] = c.gdn_k_heads;
  j["linear_num_value_heads"] = c.gdn_v_heads;
  j["full_attention_interval"] = c.full_attention_interval;
  nlohmann::json types = nlohmann::json::array();
  for (bool fa : c.full_attention) types.push_back(fa ? "full_attention" : "linear_attention");
  j["layer_types"] = types;
  const double partial = double(c.rope_dims) / double(c.head_dim);
  j["partial_rotary_factor"] = partial;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", partial}, {"mrope_section", c.rope_sections},
                          {"mrope_interleaved", true}};
  return j;
}

}  // namespace bonsai
