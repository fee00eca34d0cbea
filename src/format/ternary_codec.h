// Ternary codecs between the on-disk block formats and the canonical in-memory form.
//
// Canonical form of a ternary matrix W [N rows, K cols] (K a multiple of 128): PQ2_0 blocks, row-major,
//   blocks uint8 [N, K/128, 34]  block g of row n: fp16 d (little-endian), then 32 code bytes; element j of
//                                the group in byte j/4 at bits 2*(j%4); code q in {0,1,2} means (q - 1) * d;
//                                code 3 decodes as +2*d but never occurs in packs.
// The GGUF PQ2_0 tensor IS this layout, so a loaded PQ2_0 pack is used in place (zero copy). Read as
// little-endian u32, the 32 code bytes are 8 "words" (element 16i+j of the group at bits 2j of word i):
//   words  uint32 [N, K/16]  + scales fp16 [N, K/128] is the split form the MLX pack stores.
// PQ2_0 (ggml type 142, 34 B / 128): fp16 d, then qs[32] with element j in byte j/4 at bits 2*(j%4).
// PTQ1_0 (ggml type 143, 28 B / 128): qs[24] (5 trits per byte), qh[2] (4 trits per byte), fp16 d LAST;
//   byte m < 16 holds elements m + 16*t (t = 0..4), byte 16+m (m < 8) holds 80 + m + 8*t, qh[h] holds
//   120 + h + 2*t (t = 0..3); trit t of byte b is ((uint8)(b * 3^t) * 3) >> 8; a byte is encoded as
//   ceil(256 * sum(trit_n * 3^(4-n)) / 243), first trit most significant (qh: 4 trits times an extra 3).
// MLX affine 2-bit: the same words; scales fp16 [N, K/128] and biases = -scales.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

namespace bonsai {

constexpr int kTernaryGroup = 128;       // weights per scale
constexpr int kCodesPerWord = 16;        // 2-bit codes per uint32 word
constexpr int kPq2Bytes = 34;            // bytes per PQ2_0 block
constexpr int kPtq1Bytes = 28;           // bytes per PTQ1_0 block

// One block (128 weights). words: uint32[8], d: fp16 bits.
void pq2_decode_block(const uint8_t* block, uint32_t* words, uint16_t* d);
void pq2_encode_block(const uint32_t* words, uint16_t d, uint8_t* block);
void ptq1_decode_block(const uint8_t* block, uint32_t* words, uint16_t* d);
// Returns false (writes nothing useful) if a code is 3 (+2), which base-3 trits cannot hold.
bool ptq1_encode_block(const uint32_t* words, uint16_t d, uint8_t* block);

// Whole matrices, rows of K elements. `what` names the tensor for error messages.
// Split form (MLX): words uint32 [N, K/16], scales fp16 [N, K/128] <-> PQ2_0 blocks [N, K/128, 34].
void pq2_to_canonical(const uint8_t* src, uint64_t N, uint64_t K, uint32_t* words, uint16_t* scales);
void canonical_to_pq2(const uint32_t* words, const uint16_t* scales, uint64_t N, uint64_t K, uint8_t* dst);
// PTQ1_0 blocks [N, K/128, 28] <-> PQ2_0 blocks [N, K/128, 34] (lossless both ways for ternary codes).
void ptq1_to_pq2(const uint8_t* src, uint64_t N, uint64_t K, uint8_t* dst);
// Throws Error "<what>: row r group g holds code 3 (+2), which PTQ1_0 cannot store" on code 3.
void pq2_to_ptq1(const uint8_t* src, uint64_t N, uint64_t K, uint8_t* dst, const std::string& what);
// MLX: words are copied as-is by the caller; this checks biases == -scales (bitwise: the sign bit
// flipped) and throws naming the tensor, row and group otherwise. scales/biases fp16 [N, K/128].
void mlx_check_biases(const uint16_t* scales, const uint16_t* biases, uint64_t N, uint64_t K, const std::string& what);
void mlx_make_biases(const uint16_t* scales, uint64_t count, uint16_t* biases);

// Quantise one group of 128 floats the way the real converter does: d = max|w|,
// q = clamp(round(w / d) + 1, 0, 2) (d == 0 gives all code 1). Writes 8 words; returns d as fp16 bits.
uint16_t ternary_quantize_group(const float* w, uint32_t* words);
// Code of element e (0..K-1) of a row in split form.
inline int ternary_code(const uint32_t* row_words, uint64_t e) {
  return int((row_words[e / kCodesPerWord] >> (2 * (e % kCodesPerWord))) & 3u);
}

// One PQ2_0 block: its fp16 d (bits; unaligned little-endian load), its 32 code bytes, code of element e < 128.
inline uint16_t pq2_block_scale(const uint8_t* block) { return uint16_t(block[0] | (uint16_t(block[1]) << 8)); }
inline const uint8_t* pq2_block_codes(const uint8_t* block) { return block + 2; }
inline int pq2_block_code(const uint8_t* block, int e) { return (block[2 + e / 4] >> (2 * (e % 4))) & 3; }

// A row map of a block matrix: canonical rows [row, row + count) are stored rows [src, src + count).
// Lets a loader use a file's rows in place when it holds them in another order (GDN V heads tiled in GGUF).
struct RowRun {
  int64_t row = 0;
  int64_t src = 0;
  int64_t count = 0;
};
// The stored row of canonical row r under a row map (runs ascending, covering [0, rows)); n_runs == 0: r.
inline int64_t stored_row(const RowRun* runs, int64_t n_runs, int64_t r) {
  if (n_runs == 0) return r;
  // The last run starting at or before r.
  const RowRun* it = std::upper_bound(runs, runs + n_runs, r, [](int64_t v, const RowRun& run) { return v < run.row; });
  return (it - 1)->src + (r - (it - 1)->row);
}

}  // namespace bonsai
