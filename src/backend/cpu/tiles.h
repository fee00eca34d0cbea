// The CPU's tiled ternary layout ("tiles"): the canonical PQ2_0 rows re-cut, once at prepare(), into tiles
// of 16 rows whose codes are already transposed so that one 64-byte vector holds the same code dword of 16
// rows. The AVX-512 integer kernels then put the 16 ROWS in the 16 int32 lanes at M = 1 too: no per-chunk
// transpose (the GEMM's), no per-row scale shuffles (the canonical matvec's), one aligned load per 256
// weights. Same bytes as the canonical form (16 rows x 68 bytes per chunk), plus the padding of a last
// partial tile and of an odd last group.
//
// Layout of W [N, K] (K % 128 == 0, G = K/128 groups, C = G/2 full chunks of 256 columns):
//   tiles  uint8 [T = ceil(N/16), tile_bytes(K)]   tile t = rows 16t .. 16t+15 (rows >= N: zero codes, d = 0)
//   one tile: C chunks of kTileChunkBytes, then (G odd) one tail chunk of kTileTailBytes
//   chunk c (groups 2c, 2c+1; 1088 bytes, 64-aligned):
//     codes  uint32 [16 k, 16 r]   dword k of row r's 64 chunk code bytes (k < 8: group 2c's code bytes
//                                  4k..4k+3, k >= 8: group 2c+1's bytes 4(k-8)..): the 16 x 16 transpose of
//                                  the rows' code dwords; byte p of a row's chunk codes holds elements
//                                  4p..4p+3 of the chunk at bits 2t (the canonical order, kernels.h)
//     d      fp16   [2 h, 16 r]    d of group 2c + h of row r
//   tail chunk (group G-1 when G is odd; 576 bytes): codes uint32 [8 k, 16 r], d fp16 [16 r], 32 zero bytes.
// Tile bytes are 64-aligned when the buffer is (every chunk size is a multiple of 64).
#pragma once
#include <cstdint>

#include "format/ternary_codec.h"
#include "util/large_buffer.h"

namespace bonsai::cpu {

constexpr int64_t kTileRows = 16;
constexpr int64_t kTileChunkBytes = 16 * 64 + 2 * 16 * 2;  // 1088: codes [16, 16] dwords + d [2, 16] fp16
constexpr int64_t kTileTailBytes = 8 * 64 + 16 * 2 + 32;   // 576: codes [8, 16] dwords + d [16] fp16 + pad

inline int64_t tile_count(int64_t N) { return (N + kTileRows - 1) / kTileRows; }
inline int64_t tile_bytes(int64_t K) {
  const int64_t G = K / 128;
  return G / 2 * kTileChunkBytes + (G & 1) * kTileTailBytes;
}
inline uint64_t tiled_bytes(int64_t N, int64_t K) { return uint64_t(tile_count(N)) * uint64_t(tile_bytes(K)); }
// Byte offsets inside one tile of group g's first code vector (its 8 vectors 64 B apart) and of its 16 rows' fp16 d;
// the last group of an odd G is the tail chunk.
inline int64_t tile_group_codes(int64_t G, int64_t g) {
  const int64_t c = g / 2;
  return c * kTileChunkBytes + (2 * c + 1 < G ? 512 * (g % 2) : 0);
}
inline int64_t tile_group_d(int64_t G, int64_t g) {
  const int64_t c = g / 2;
  return c * kTileChunkBytes + (2 * c + 1 < G ? 1024 + 32 * (g % 2) : 512);
}

// Builds the tiles of W [N, K] from its canonical PQ2_0 blocks (row r stored at row `runs`-mapped, as
// TernaryOut: n_runs == 0 means row r is stored row r). out: tiled_bytes(N, K) bytes, 64-aligned; every byte
// is written. Threaded over tiles with the CPU pool.
void build_tiles(const uint8_t* blocks, const RowRun* runs, int64_t n_runs, int64_t N, int64_t K, uint8_t* out);

// The tiles of one matrix in a buffer of their own (2 MiB pages when large; util/large_buffer.h).
struct TiledCopy {
  LargeVector<uint8_t> buf;        // tiled_bytes(N, K) + 64 bytes of alignment slack
  const uint8_t* tiles = nullptr;  // the 64-aligned tiles inside buf
};
// Allocates and builds (build_tiles); throws std::bad_alloc when the memory is not there.
TiledCopy make_tiled_copy(const uint8_t* blocks, const RowRun* runs, int64_t n_runs, int64_t N, int64_t K);

}  // namespace bonsai::cpu
