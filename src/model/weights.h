// The canonical in-memory model. Every pack format (GGUF PQ2_0, GGUF PTQ1_0, the MLX folder) loads to
// exactly this form; backends see only this, never a file.
//
// Conventions (chosen once, here):
// - GDN heads are in grouped order (V head h belongs to K head h / (Nv/Nk)), the HF order: the GGUF's
//   tiled V order is undone at load on exactly the tensors the converter permuted.
// - RMSNorm gains are the multiplicative gains: y = x / rms(x) * gain. Packs store (1 + w_hf) for the
//   five PlusOne norms, which IS the multiplicative gain, so it is used as stored; ssm_norm is stored raw
//   and is also multiplicative. (HF checkpoints hold w_hf; the effective-weights writer subtracts 1.)
// - A = -exp(A_log) per GDN head (see GdnWeights::A); conv taps [C, Kc] with tap Kc-1 applied to the newest input.
// - Ternary matrices: words u32 [N, K/16] + scales fp16 [N, K/128] (format/ternary_codec.h), with a
//   `folded` flag: a folded linear reads R x = FWHT_n(s_K * x) / sqrt(n) instead of x.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "util/large_buffer.h"

namespace bonsai {

struct TernaryMatrix {
  std::string name;               // GGUF-style tensor name, for messages
  int64_t rows = 0;               // N (outputs)
  int64_t cols = 0;               // K (reduction)
  LargeVector<uint32_t> words;    // u32 [N, K/16], 16 codes per word, element 16i+j at bits 2j
  LargeVector<uint16_t> scales;   // fp16 [N, K/128]
  bool folded = false;            // input goes through sign+FWHT of width K before the product
  // Optional gather applied to the activation before sign+FWHT: x'[i] = x[input_perm[i]], [K].
  // Only for a folded GDN out_proj whose columns stay tiled (gdn_v_grouped = false).
  std::vector<int32_t> input_perm;
  uint64_t bytes() const { return words.size() * 4 + scales.size() * 2; }
  const uint32_t* row_words(int64_t r) const { return words.data() + r * (cols / 16); }
  const uint16_t* row_scales(int64_t r) const { return scales.data() + r * (cols / 128); }
};

struct AttentionWeights {
  TernaryMatrix q;                 // [2*H*Dh, E]: per head Dh query rows then Dh gate rows
  TernaryMatrix k, v;              // [Hkv*Dh, E]
  TernaryMatrix o;                 // [E, H*Dh]
  std::vector<float> q_norm;       // [Dh] gain
  std::vector<float> k_norm;       // [Dh] gain
};

struct GdnWeights {
  TernaryMatrix qkv;               // [2*Nk*Dk + Nv*Dv, E]: rows q | k | v (grouped)
  TernaryMatrix z;                 // [Nv*Dv, E] output gate
  TernaryMatrix out;               // [E, Nv*Dv]
  std::vector<float> a;            // [Nv, E] in_proj_a (not folded: reads the un-rotated normed x)
  std::vector<float> b;            // [Nv, E] in_proj_b
  // [Nv] A = -exp(A_log), the per-head decay rate (g = A * softplus(a + dt_bias)). Kept in this form,
  // not as A_log: it is what GGUF stores (ssm_a) and what the forward needs, so the GGUF path is exact
  // and the MLX path (which stores A_log) computes it once with the same expression make-pack uses.
  std::vector<float> A;
  std::vector<float> dt_bias;      // [Nv]
  std::vector<float> conv;         // [C, Kc] depthwise taps, C = 2*Nk*Dk + Nv*Dv
  std::vector<float> norm;         // [Dv] gated RMSNorm gain
};

struct LayerWeights {
  bool full_attention = false;
  std::vector<float> attn_norm;    // [E]
  std::vector<float> post_norm;    // [E]
  AttentionWeights attn;           // full-attention layers
  GdnWeights gdn;                  // Gated DeltaNet layers
  TernaryMatrix gate, up;          // [FF, E]
  TernaryMatrix down;              // [E, FF]
};

struct HadamardRotation {
  bool enabled = false;            // false: an unrotated pack, no transforms anywhere
  int64_t block = 0;               // n
  std::vector<int64_t> widths;     // sign widths, in file order
  std::vector<std::vector<int8_t>> signs;  // per width: [width] of +-1; empty vectors in identity mode
  bool explicit_signs = false;
  // Sign vector for K, or nullptr (identity mode). Throws if explicit and no vector has width K.
  const int8_t* signs_for(int64_t K) const;
};

struct Model {
  ModelConfig config;
  HadamardRotation hadamard;
  TernaryMatrix embed;             // [vocab, E]; rows are R e when embed_inverse (transform after gather)
  bool embed_inverse = false;
  TernaryMatrix head;              // [vocab, E] (a copy of embed's words when tied is not supported)
  std::vector<float> out_norm;     // [E]
  std::vector<LayerWeights> layers;

  std::string source_path;         // the pack it came from
  std::string source_format;       // "gguf-pq2_0", "gguf-ptq1_0", "mlx"

  // Every ternary matrix, in forward order (embedding first, head last), for accounting and tests.
  std::vector<const TernaryMatrix*> ternary_matrices() const;
  // Bytes a decode step reads: every weight except the embedding table (one row of it is read).
  uint64_t decode_weight_bytes() const;
  uint64_t total_weight_bytes() const;
};

// The canonical buffer that holds a tensor role of the inventory (model/tensor_names.h): the one place
// that maps a role to a field, for writers and tests. ternary_of is nullptr for non-ternary roles and
// floats_of throws for ternary ones. GdnA maps to GdnWeights::A (= -exp(A_log), not what MLX stores).
enum class Role;
const TernaryMatrix* ternary_of(const Model& m, Role role, int64_t layer);
const std::vector<float>& floats_of(const Model& m, Role role, int64_t layer);

}  // namespace bonsai
