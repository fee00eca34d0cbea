#include "backend/cpu/tiles.h"

#include <cstring>

#include "backend/cpu/pq2_rows.h"
#include "backend/cpu/thread_pool.h"

namespace bonsai::cpu {
namespace {

// One tile: rows 16t .. 16t+15 of the matrix (row pointers, nullptr past N) into `out`.
void build_tile(const uint8_t* const rows[kTileRows], int64_t K, uint8_t* out) {
  const int64_t G = K / 128;
  for (int64_t g0 = 0; g0 < G; g0 += 2) {
    const int64_t groups = g0 + 1 < G ? 2 : 1;
    uint8_t* codes = out;                        // uint32 [8 * groups, 16]
    uint8_t* d = out + groups * 8 * 64;          // fp16 [groups, 16]
    std::memset(out, 0, size_t(groups == 2 ? kTileChunkBytes : kTileTailBytes));
    for (int64_t r = 0; r < kTileRows; ++r) {
      if (!rows[r]) continue;  // padding row: zero codes, d = 0 (its outputs are never stored)
      for (int64_t h = 0; h < groups; ++h) {
        const uint8_t* blk = rows[r] + (g0 + h) * kPq2Bytes;
        for (int64_t k = 0; k < 8; ++k) std::memcpy(codes + (8 * h + k) * 64 + 4 * r, pq2_block_codes(blk) + 4 * k, 4);
        const uint16_t s = pq2_block_scale(blk);
        std::memcpy(d + (h * kTileRows + r) * 2, &s, 2);
      }
    }
    out += groups == 2 ? kTileChunkBytes : kTileTailBytes;
  }
}

}  // namespace

void build_tiles(const uint8_t* blocks, const RowRun* runs, int64_t n_runs, int64_t N, int64_t K, uint8_t* out) {
  const int64_t rb = row_bytes(K), tb = tile_bytes(K);
  parallel_for(0, tile_count(N), 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* rows[kTileRows];
      for (int64_t r = 0; r < kTileRows; ++r) {
        const int64_t n = t * kTileRows + r;
        rows[r] = n < N ? blocks + stored_row(runs, n_runs, n) * rb : nullptr;
      }
      build_tile(rows, K, out + t * tb);
    }
  });
}

TiledCopy make_tiled_copy(const uint8_t* blocks, const RowRun* runs, int64_t n_runs, int64_t N, int64_t K) {
  TiledCopy c;
  c.buf.resize(tiled_bytes(N, K) + 64);
  uint8_t* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(c.buf.data()) + 63) & ~uintptr_t(63));
  build_tiles(blocks, runs, n_runs, N, K, aligned);
  c.tiles = aligned;
  return c;  // moving the vector keeps its heap buffer, so `tiles` stays valid
}

}  // namespace bonsai::cpu
