// The tensor inventory of a qwen35 pack: one row per tensor role with its GGUF name, its HF name
// (MLX packs and the effective float weights), and the shape it must have for a given config.
// The loader and make-pack both read this table, so a name lives in exactly one place.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace bonsai {

enum class Role {
  // global
  TokenEmbd, OutputNorm, Output,
  // every layer
  AttnNorm, PostAttnNorm, FfnGate, FfnUp, FfnDown,
  // full-attention layers
  AttnQ, AttnK, AttnV, AttnOutput, AttnQNorm, AttnKNorm,
  // Gated DeltaNet layers
  GdnQkv, GdnGate, GdnConv, GdnDtBias, GdnA, GdnAlpha, GdnBeta, GdnNorm, GdnOut,
};

enum class TensorKind {
  Ternary,   // PQ2_0 / PTQ1_0 (GGUF), u32 words + scales + biases (MLX)
  Vector,    // F32 1-D
  Dense,     // small float matrix: BF16 (GGUF), F16/BF16/F32 (MLX)
  Conv,      // F32 [C, Kc] (GGUF ne [Kc, C]; HF [C, 1, Kc])
};

struct TensorSpec {
  Role role;
  int64_t layer;              // -1 for global tensors
  TensorKind kind;
  std::string gguf_name;      // "blk.3.attn_q.weight"
  std::string hf_name;        // "model.layers.3.self_attn.q_proj.weight" (no MLX prefix)
  std::vector<uint64_t> ne;   // GGUF order: ne[0] = K (row length), ne[1] = N rows
  bool required = true;
  int64_t rows() const { return ne.size() > 1 ? int64_t(ne[1]) : 1; }
  int64_t cols() const { return int64_t(ne[0]); }
};

// Every tensor a pack of this config holds, in the order the real converter writes them.
std::vector<TensorSpec> tensor_specs(const ModelConfig& c);
// Finds the spec whose GGUF name or HF name (with or without a "language_model." / "model.language_model."
// prefix, with or without ".weight") is `name`.
const TensorSpec* find_spec(const std::vector<TensorSpec>& specs, const std::string& name);
const char* role_name(Role r);

}  // namespace bonsai
