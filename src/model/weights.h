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
// - Ternary matrices: PQ2_0 blocks [N, K/128] of 34 B (fp16 d + 32 code bytes, format/ternary_codec.h),
//   viewed in place in the mapped pack when it is PQ2_0, with a `folded` flag: a folded linear reads
//   R x = FWHT_n(s_K * x) / sqrt(n) instead of x.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/ternary_codec.h"
#include "model/config.h"

namespace bonsai {

struct TernaryMatrix {
  std::string name;               // GGUF-style tensor name, for messages
  int64_t rows = 0;               // N (outputs)
  int64_t cols = 0;               // K (reduction)
  // PQ2_0 blocks uint8 [stored rows, K/128, 34]: fp16 d then 32 code bytes (format/ternary_codec.h).
  // Either a view into the mapped pack (GGUF PQ2_0: zero copy) or into an owned buffer (other formats,
  // make-pack); `storage` keeps whichever it is alive, so a Model outlives the Pack it was loaded from.
  const uint8_t* blocks = nullptr;
  std::shared_ptr<const void> storage;
  bool owned = false;             // true: `storage` is a buffer made for this matrix; false: a view
  // Empty: canonical row r is stored row r. Otherwise ascending runs covering [0, rows): the GGUF holds
  // some GDN V-head rows tiled, and the view reads them in place in grouped order instead of copying.
  std::vector<RowRun> row_runs;
  bool folded = false;            // input goes through sign+FWHT of width K before the product
  // Optional gather applied to the activation before sign+FWHT: x'[i] = x[input_perm[i]], [K].
  // Only for a folded GDN out_proj whose columns stay tiled (gdn_v_grouped = false).
  std::vector<int32_t> input_perm;

  int64_t groups() const { return cols / kTernaryGroup; }                       // K/128 blocks per row
  uint64_t row_bytes() const { return uint64_t(groups()) * kPq2Bytes; }
  uint64_t bytes() const { return uint64_t(rows) * row_bytes(); }
  int64_t stored_row(int64_t r) const;                                          // applies row_runs
  const uint8_t* row_blocks(int64_t r) const { return blocks + uint64_t(stored_row(r)) * row_bytes(); }
  const uint8_t* block(int64_t r, int64_t g) const { return row_blocks(r) + uint64_t(g) * kPq2Bytes; }
  uint16_t group_scale(int64_t r, int64_t g) const { return pq2_block_scale(block(r, g)); }  // fp16 bits
  const uint8_t* group_codes(int64_t r, int64_t g) const { return pq2_block_codes(block(r, g)); }  // [32]
  int code(int64_t r, int64_t e) const { return pq2_block_code(block(r, e / kTernaryGroup), int(e % kTernaryGroup)); }

  // Makes this matrix own fresh storage of rows x cols (uninitialised, huge pages: util/large_buffer.h)
  // with no row map; returns the writable blocks [rows, K/128, 34].
  uint8_t* allocate(int64_t n_rows, int64_t n_cols);
  // Makes this matrix a view of `data` (blocks [rows, K/128, 34] in stored order) kept alive by `owner`.
  void view(const uint8_t* data, std::shared_ptr<const void> owner);
  // Owned copy of split-form words u32 [N, K/16] + scales fp16 [N, K/128] (MLX, tests).
  void assign_split(const uint32_t* words, const uint16_t* scales, int64_t n_rows, int64_t n_cols);
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
  TernaryMatrix head;              // [vocab, E]; when tied, shares embed's storage (folded = embed_inverse)
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
