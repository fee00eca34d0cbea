#include "pack/pack_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "format/ternary_codec.h"
#include "model/pack.h"
#include "model/tensor_names.h"
#include "tokenizer/gguf_vocabulary.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "util/error.h"
#include "util/half.h"
#include "util/progress.h"

namespace bonsai {

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> half_bytes(const std::vector<float>& v, bool bf16) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = bf16 ? f32_to_bf16(v[i]) : f32_to_fp16(v[i]);
    std::memcpy(&b[2 * i], &h, 2);
  }
  return b;
}

// File row r (tiled V order in GGUF) comes from canonical row src[r].
std::vector<int64_t> gguf_row_order(const ModelConfig& c, const TensorSpec& s) {
  // Vectors (ssm_a, dt_bias) have one "row" per entry.
  std::vector<int64_t> src(static_cast<size_t>(s.kind == TensorKind::Vector ? s.cols() : s.rows()));
  for (size_t i = 0; i < src.size(); ++i) src[i] = int64_t(i);
  auto tile = [&](int64_t base, int64_t per_head) {
    for (int64_t t = 0; t < c.gdn_v_heads; ++t) {
      const int64_t g = gdn_tiled_to_grouped(t, c.gdn_k_heads, c.gdn_v_heads);
      for (int64_t r = 0; r < per_head; ++r) src[size_t(base + t * per_head + r)] = base + g * per_head + r;
    }
  };
  switch (s.role) {
    case Role::GdnQkv: tile(2 * c.gdn_key_dim(), c.gdn_head_dim); break;
    case Role::GdnGate: tile(0, c.gdn_head_dim); break;
    case Role::GdnAlpha: case Role::GdnBeta: case Role::GdnA: case Role::GdnDtBias: tile(0, 1); break;
    default: break;
  }
  return src;
}

// A ternary matrix as the GGUF's PQ2_0 bytes [N, K/128, 34]: the canonical blocks with V rows tiled; an
// unfolded ssm_out also has its columns (whole blocks per head) tiled.
std::vector<uint8_t> gguf_ordered_pq2(const ModelConfig& c, const TensorSpec& s, const TernaryMatrix& t) {
  const uint64_t rb = t.row_bytes();
  std::vector<uint8_t> out(t.bytes());
  const auto src = gguf_row_order(c, s);
  for (int64_t r = 0; r < t.rows; ++r) std::memcpy(&out[size_t(uint64_t(r) * rb)], t.row_blocks(src[size_t(r)]), size_t(rb));
  if (s.role == Role::GdnOut && !t.folded) {
    const int64_t Dv = c.gdn_head_dim;
    if (Dv % 128 != 0) fail("{}: cannot tile the columns of an unfolded ssm_out with head dim {} (not a multiple of 128)", t.name, Dv);
    const size_t head_bytes = size_t(Dv / 128) * kPq2Bytes;
    for (int64_t r = 0; r < t.rows; ++r) {
      const uint8_t* canon = t.row_blocks(r);
      uint8_t* row = &out[size_t(uint64_t(r) * rb)];
      for (int64_t tt = 0; tt < c.gdn_v_heads; ++tt) {
        const int64_t g = gdn_tiled_to_grouped(tt, c.gdn_k_heads, c.gdn_v_heads);
        std::memcpy(row + size_t(tt) * head_bytes, canon + size_t(g) * head_bytes, head_bytes);
      }
    }
  }
  return out;
}

std::vector<float> gguf_ordered_floats(const ModelConfig& c, const TensorSpec& s, const std::vector<float>& v) {
  if (s.role == Role::GdnConv) {  // V channels tiled
    std::vector<float> o = v;
    const int64_t Kc = c.conv_kernel, Dv = c.gdn_head_dim, base = 2 * c.gdn_key_dim();
    for (int64_t t = 0; t < c.gdn_v_heads; ++t) {
      const int64_t g = gdn_tiled_to_grouped(t, c.gdn_k_heads, c.gdn_v_heads);
      std::memcpy(&o[size_t((base + t * Dv) * Kc)], &v[size_t((base + g * Dv) * Kc)], size_t(Dv * Kc) * 4);
    }
    return o;
  }
  const auto src = gguf_row_order(c, s);
  const int64_t K = s.kind == TensorKind::Dense ? s.cols() : 1;
  std::vector<float> o(v.size());
  for (size_t r = 0; r < src.size(); ++r) std::memcpy(&o[r * size_t(K)], &v[size_t(src[r] * K)], size_t(K) * 4);
  return o;
}

std::vector<float> a_log_of(const Model& m, const PackExtras& x, int64_t layer) {
  auto it = x.a_log.find(layer);
  if (it != x.a_log.end()) return it->second;
  std::vector<float> v = m.layers[size_t(layer)].gdn.A;
  for (auto& a : v) a = std::log(-a);
  return v;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot create", path);
  out << text;
  if (!out) fail("{}: write failed", path);
}

}  // namespace

HadamardContract contract_for_rotation(const HadamardRotation& r) {
  HadamardContract h;
  if (!r.enabled) return h;
  h.present = true;
  h.version = 1;
  h.block_size = uint32_t(r.block);
  h.transform = kHadamardTransform;
  h.axis = kHadamardAxis;
  h.sign_mode = r.explicit_signs ? "explicit" : "identity";
  if (r.explicit_signs)
    for (size_t i = 0; i < r.widths.size(); ++i) {
      h.sign_widths.push_back(r.widths[i]);
      h.signs[r.widths[i]] = r.signs[i];
    }
  h.has_gdn_v_grouped = true;  // folded ssm_out keeps grouped columns, as the real converter writes it
  h.gdn_v_grouped = true;
  return h;
}

HadamardContract contract_for(const Model& m) {
  HadamardContract h = contract_for_rotation(m.hadamard);
  if (!h.present) return h;
  for (const TensorSpec& s : tensor_specs(m.config)) {
    const TernaryMatrix* t = ternary_of(m, s.role, s.layer);
    if (t && t->folded && s.role != Role::TokenEmbd) h.weight_names.push_back(s.gguf_name);
  }
  if (m.embed_inverse) h.inverse_weight_names.push_back("token_embd.weight");
  return h;
}

void write_gguf_pack(const Model& m, const PackExtras& x, TernaryFormat fmt, const std::string& path) {
  const ModelConfig& c = m.config;
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("qwen35"));
  w.set("general.name", GgufValue::str(x.name));
  w.set("general.file_type", GgufValue::u32(fmt == TernaryFormat::PQ2_0 ? 141 : 142));
  config_to_gguf(c, w);
  if (x.vocab) add_vocabulary_to_gguf(w, *x.vocab);
  if (!x.chat_template.empty()) w.set("tokenizer.chat_template", GgufValue::str(x.chat_template));
  if (m.hadamard.enabled) hadamard_to_gguf(contract_for(m), w);
  const uint32_t ttype = fmt == TernaryFormat::PQ2_0 ? ggml_type::PQ2_0 : ggml_type::PTQ1_0;
  for (const TensorSpec& s : tensor_specs(c)) {
    if (!s.required && s.role == Role::Output && c.tied_embeddings) continue;
    if (const TernaryMatrix* t = ternary_of(m, s.role, s.layer)) {
      // PQ2_0 is the canonical block layout: the tensor is a copy of the (file-ordered) blocks.
      std::vector<uint8_t> pq2 = gguf_ordered_pq2(c, s, *t);
      if (fmt == TernaryFormat::PQ2_0) {
        w.add_tensor(s.gguf_name, ttype, s.ne, std::move(pq2));
      } else {
        std::vector<uint8_t> bytes(uint64_t(t->rows) * uint64_t(t->groups()) * kPtq1Bytes);
        pq2_to_ptq1(pq2.data(), uint64_t(t->rows), uint64_t(t->cols), bytes.data(), s.gguf_name);
        w.add_tensor(s.gguf_name, ttype, s.ne, std::move(bytes));
      }
      continue;
    }
    const std::vector<float> v = gguf_ordered_floats(c, s, floats_of(m, s.role, s.layer));
    if (s.kind == TensorKind::Dense) w.add_tensor(s.gguf_name, ggml_type::BF16, s.ne, half_bytes(v, true));
    else w.add_tensor(s.gguf_name, ggml_type::F32, s.ne, f32_bytes(v));
  }
  Progress progress("writing " + path, w.total_bytes(), x.progress);
  w.write(path, x.progress ? &progress : nullptr);
  progress.finish();
}

void write_mlx_pack(const Model& m, const PackExtras& x, const std::string& dir) {
  const ModelConfig& c = m.config;
  fs::create_directories(dir);
  SafetensorsWriter st;
  st.set_metadata("format", "mlx");
  nlohmann::json modules = nlohmann::json::array();
  for (const TensorSpec& s : tensor_specs(c)) {
    if (!s.required && s.role == Role::Output && c.tied_embeddings) continue;
    const std::string name = "language_model." + s.hf_name;
    if (const TernaryMatrix* t = ternary_of(m, s.role, s.layer)) {
      const std::string base = name.substr(0, name.size() - 7);  // drop ".weight"
      const uint64_t N = uint64_t(t->rows), K = uint64_t(t->cols), G = K / 128;
      // Split form: words u32 [N, K/16] (the blocks' code bytes), scales fp16 [N, K/128], biases = -scales.
      std::vector<uint8_t> words(N * G * 32), scales(N * G * 2), biases(N * G * 2);
      for (uint64_t r = 0; r < N; ++r)
        for (uint64_t g = 0; g < G; ++g) {
          const uint8_t* blk = t->block(int64_t(r), int64_t(g));
          std::memcpy(&words[(r * G + g) * 32], pq2_block_codes(blk), 32);
          std::memcpy(&scales[(r * G + g) * 2], blk, 2);
        }
      mlx_make_biases(reinterpret_cast<const uint16_t*>(scales.data()), N * G, reinterpret_cast<uint16_t*>(biases.data()));
      st.add(base + ".weight", StDtype::U32, {N, K / 16}, std::move(words));
      st.add(base + ".scales", StDtype::F16, {N, K / 128}, std::move(scales));
      st.add(base + ".biases", StDtype::F16, {N, K / 128}, std::move(biases));
      modules.push_back({{"name", base.substr(std::string("language_model.").size())},
                         {"block", m.hadamard.enabled ? m.hadamard.block : 0},
                         {"embedding", s.role == Role::TokenEmbd}});
      continue;
    }
    std::vector<float> v = s.role == Role::GdnA ? a_log_of(m, x, s.layer) : floats_of(m, s.role, s.layer);
    if (s.kind == TensorKind::Dense) {
      st.add(name, StDtype::BF16, {uint64_t(s.rows()), uint64_t(s.cols())}, half_bytes(v, true));
    } else if (s.kind == TensorKind::Conv) {
      st.add(name, StDtype::F32, {uint64_t(s.rows()), 1, uint64_t(s.cols())}, f32_bytes(v));  // HF [C, 1, Kc]
    } else {
      st.add(name, StDtype::F32, {uint64_t(s.cols())}, f32_bytes(v));
    }
  }
  st.write(dir + "/model.safetensors");
  nlohmann::ordered_json cfg;
  cfg["model_type"] = m.hadamard.enabled ? "prism_hadamard_qwen35" : "qwen3_5";
  cfg["architectures"] = {"Qwen3_5ForConditionalGeneration"};
  cfg["text_config"] = config_to_hf(c);
  cfg["quantization"] = {{"bits", 2}, {"group_size", 128}, {"mode", "affine"}, {"modules", modules}};
  if (x.vocab && x.vocab->eos_id >= 0) cfg["eos_token_id"] = x.vocab->eos_id;
  write_text(dir + "/config.json", cfg.dump(2) + "\n");
  if (m.hadamard.enabled) write_text(dir + "/hadamard.json", hadamard_to_json(contract_for(m)).dump(2) + "\n");
  if (x.vocab) {
    write_tokenizer_json(*x.vocab, dir + "/tokenizer.json");
    write_tokenizer_config_json(*x.vocab, dir + "/tokenizer_config.json");
    nlohmann::ordered_json gc;
    gc["eos_token_id"] = x.vocab->stop_ids();
    write_text(dir + "/generation_config.json", gc.dump(2) + "\n");
  }
  if (!x.chat_template.empty()) write_text(dir + "/chat_template.jinja", x.chat_template);
}

void write_effective_weights(const FloatModel& f, const PackExtras& x, const std::string& dir) {
  const ModelConfig& c = f.config;
  fs::create_directories(dir);
  SafetensorsWriter st;
  st.set_metadata("format", "pt");
  st.set_metadata("bonsai", "effective float weights: de-quantised, un-rotated, HF names and conventions");
  for (const TensorSpec& s : tensor_specs(c)) {
    auto it = f.tensors.find(s.hf_name);
    if (it == f.tensors.end()) continue;
    std::vector<uint64_t> shape;
    if (s.kind == TensorKind::Vector) shape = {uint64_t(s.cols())};
    else if (s.kind == TensorKind::Conv) shape = {uint64_t(s.rows()), 1, uint64_t(s.cols())};
    else shape = {uint64_t(s.rows()), uint64_t(s.cols())};
    st.add(s.hf_name, StDtype::F32, shape, f32_bytes(it->second));
  }
  st.write(dir + "/model.safetensors");
  nlohmann::json cfg = config_to_hf(c);
  cfg["architectures"] = {"Qwen3_5ForCausalLM"};
  cfg["torch_dtype"] = "float32";
  if (x.vocab && x.vocab->eos_id >= 0) cfg["eos_token_id"] = x.vocab->eos_id;
  write_text(dir + "/config.json", cfg.dump(2) + "\n");
  if (x.vocab) write_tokenizer_json(*x.vocab, dir + "/tokenizer.json");
}

}  // namespace bonsai
