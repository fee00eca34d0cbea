// Reading rows of PQ2_0 blocks in the CPU kernels (every variant, and the op layer): row n of a matrix of
// K columns starts at blocks + n * row_bytes(K); group g's block at + 34 g holds the fp16 d (unaligned),
// then the 32 code bytes. Plain inline code (no target attributes), so every variant can inline it.
#pragma once
#include <cstdint>
#include <cstring>

#include "format/ternary_codec.h"
#include "util/half.h"

namespace bonsai::cpu {

// Bytes of one row of PQ2_0 blocks [K/128, 34].
inline int64_t row_bytes(int64_t K) { return K / 128 * kPq2Bytes; }
// An unaligned little-endian 32-bit load (code bytes sit at offset 2 of their block).
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// A block's scale d as fp32.
inline float block_d(const uint8_t* blk) { return fp16_to_f32(pq2_block_scale(blk)); }

}  // namespace bonsai::cpu
