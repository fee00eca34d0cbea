// Plain parameter structs shared by every backend's op signatures (bonsai::ref, bonsai::cpu, ...),
// so that the free functions of each backend have identical signatures.
#pragma once
#include <cstdint>

namespace bonsai {

// One output of ternary_matmul_multi: a canonical ternary matrix W [N, K] and where y = x W^T goes.
//   words  uint32 [N, K/16]  element 16*i + j of a row at bits 2j of word i, code q -> (q - 1) * d
//   scales fp16   [N, K/128] bits, d per group of 128 consecutive elements of a row
//   y      fp32   [M, N]     row-major, written (not accumulated)
struct TernaryOut {
  const uint32_t* words;
  const uint16_t* scales;
  int64_t N;
  float* y;
};

}  // namespace bonsai
