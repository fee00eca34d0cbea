// Plain parameter structs shared by every backend's op signatures (bonsai::ref, bonsai::cpu, ...),
// so that the free functions of each backend have identical signatures.
#pragma once
#include <cstdint>

#include "format/ternary_codec.h"

namespace bonsai {

// One output of ternary_matmul_multi: a canonical ternary matrix W [N, K] and where y = x W^T goes.
//   blocks uint8 [N, K/128, 34]  PQ2_0 blocks (format/ternary_codec.h): fp16 d, then 32 code bytes, element j
//                                of a group in byte j/4 at bits 2*(j%4), code q -> (q - 1) * d
//   y      fp32  [M, N]          row-major, written (not accumulated)
//   runs   optional row map [n_runs] (TernaryMatrix::row_runs): row r of W is stored row
//          run.src + (r - run.row) of `blocks`; n_runs == 0: row r is stored row r
struct TernaryOut {
  const uint8_t* blocks;
  int64_t N;
  float* y;
  const RowRun* runs = nullptr;
  int64_t n_runs = 0;
  // Optional, CPU only: the same matrix in the CPU's tiled layout (backend/cpu/tiles.h; canonical row
  // order, the row map already applied). The CPU's integer kernels read it when their variant has tiled
  // kernels; every other path reads `blocks`.
  const uint8_t* tiles = nullptr;
};

}  // namespace bonsai
