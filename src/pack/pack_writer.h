// Writers that serialise a canonical Model the way the real converter lays out each format:
// GGUF PQ2_0 / PTQ1_0 (qwen35.* keys, prism.hadamard.* keys, tokenizer.ggml.*, tiled GDN V order,
// ssm_a = A, conv [Kc, C]), the MLX folder (HF names under language_model., words + scales + biases,
// config.json with text_config and quantization, hadamard.json, tokenizer files), and the effective
// float weights (HF names and conventions, F32 safetensors + config.json) for an independent reference.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/hadamard_contract.h"
#include "model/weights.h"
#include "pack/float_model.h"
#include "tokenizer/vocabulary.h"

namespace bonsai {

struct PackExtras {
  std::string name = "bonsai";                       // general.name
  // Per GDN layer: the A_log the model was drawn with (MLX stores A_log; GGUF stores -exp(A_log)).
  // Absent layers fall back to log(-A).
  std::map<int64_t, std::vector<float>> a_log;
  const Vocabulary* vocab = nullptr;                  // tokenizer metadata / files, when present
  std::string chat_template;                          // tokenizer.chat_template / chat_template.jinja
  bool progress = false;
};

enum class TernaryFormat { PQ2_0, PTQ1_0 };

// The prism.hadamard contract a converter would write for this model (folded names in GGUF naming).
HadamardContract contract_for(const Model& m);
// The contract's header (version, block, transform, axis, signs, gdn_v_grouped) without weight names.
HadamardContract contract_for_rotation(const HadamardRotation& r);

void write_gguf_pack(const Model& m, const PackExtras& x, TernaryFormat fmt, const std::string& path);
void write_mlx_pack(const Model& m, const PackExtras& x, const std::string& dir);
// Writes dir/model.safetensors (F32, HF names) and dir/config.json (Qwen3_5ForCausalLM) + tokenizer.json.
void write_effective_weights(const FloatModel& f, const PackExtras& x, const std::string& dir);

}  // namespace bonsai
