// A float model in HuggingFace naming and conventions (what a Qwen3.5 checkpoint holds), drawn from a
// seed, and the fold + ternarisation that turns it into the canonical Model the real converter would
// have produced.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace bonsai {

struct FloatModel {
  ModelConfig config;
  // HF name (no prefix) -> fp32 values, row-major in the HF shape:
  //   linears [N, K]; norms [n] as HF stores them (w, applied as 1 + w, except linear_attn.norm: raw gain);
  //   conv1d [C, Kc] (HF [C, 1, Kc]); A_log, dt_bias [Nv]; in_proj_a/b [Nv, K]; embed_tokens [vocab, E].
  std::map<std::string, std::vector<float>> tensors;
};

FloatModel draw_float_model(const ModelConfig& c, uint64_t seed);

// One sign vector per width the folded linears read (E, H*Dh = Nv*Dv, FF), drawn from the seed.
// The first 16 entries of width 5120 (when present) are the real model's, a recognisable anchor.
HadamardRotation draw_rotation(const ModelConfig& c, int64_t block, uint64_t seed);

// Fold R into every linear and the head, inverse-rotate the embedding, ternarise with d = max|w| per
// 128 (as the real quantiser), and apply the canonical conventions. rotation.enabled == false gives the
// unrotated pack of the same float model. a/b projections are rounded to bf16 (what GGUF stores).
Model fold_and_ternarise(const FloatModel& f, const HadamardRotation& rotation);

// The effective float weights of a canonical model in HF naming and conventions: ternary matrices
// de-quantised and un-rotated (w = R^T w'), the embedding un-rotated, norms back to HF (gain - 1),
// A_log from `a_log` (per layer; the exact values the pack was written from). fp64 transforms.
FloatModel effective_float_model(const Model& m, const std::map<int64_t, std::vector<float>>& a_log);

// In-place fp64 blockwise Hadamard on one row: forward = H (s * x) / sqrt(n), inverse = s * (H x) / sqrt(n).
void fwht_rows_f64(double* x, int64_t K, const int8_t* signs, int64_t block, bool inverse);

}  // namespace bonsai
