// The CPU backend's innermost kernels, behind a table chosen once at startup (runtime dispatch).
//
// Only portable C++ variants exist today (written so that GCC/Clang auto-vectorise them for the
// baseline x86-64 SSE2 target). An AVX2 / AVX-512 variant is added by writing the same functions in a
// file compiled with the matching target attribute and selecting it in kernels.cpp when
// __builtin_cpu_supports says the machine has it. The op entry points (ops.h) never change.
#pragma once
#include <cstdint>

namespace bonsai::cpu {

struct Kernels {
  const char* name;
  // Unnormalised in-place Sylvester FWHT of one block: x fp32 [n], n a power of two.
  // pre_signs: optional int8 [n] (+-1) multiplied in before the transform; post_signs: optional int8 [n]
  // multiplied in after it; `scale` always multiplies the result (1/sqrt(n) for the rotation).
  void (*fwht_block)(float* x, int64_t n, const int8_t* pre_signs, const int8_t* post_signs, float scale);
  // y[n - n0] = sum_e W[n][e] x[e] for rows n0 <= n < n1 of a canonical ternary W [*, K] (M = 1).
  void (*ternary_rows_x1)(const uint32_t* words, const uint16_t* scales, int64_t K, int64_t n0, int64_t n1,
                          const float* x, float* y);
  // Y[m][n] = sum_e W[n][e] X[m][e] for rows n0 <= n < n1, all m < M; X fp32 [M, K];
  // y points at Y[0][n0] and rows of Y are ldy apart.
  void (*ternary_rows_xm)(const uint32_t* words, const uint16_t* scales, int64_t K, int64_t n0, int64_t n1,
                          const float* x, int64_t M, float* y, int64_t ldy);
  // fp32 dot product of length n with several partial sums.
  float (*dot)(const float* a, const float* b, int64_t n);
};

const Kernels& kernels();          // the variant for this machine
const Kernels& portable_kernels();  // always the portable one (tests compare variants against it)

}  // namespace bonsai::cpu
