// The CPU backend's innermost kernels, behind a table chosen once at startup (runtime dispatch).
//
// Variants (each in its own translation unit, compiled with function-level target attributes so the
// binary still runs on any x86-64; no -march=native):
//   "avx512vnni"  AVX-512 F/BW/VL/DQ + VNNI (vpdpbusd)        kernels_avx512vnni.cpp
//   "avx512bw"    AVX-512 F/BW/VL/DQ, no VNNI (vpmaddubsw)     kernels_avx512bw.cpp
//   "avx2"        AVX2 + FMA                                   kernels_avx2.cpp
//   "portable"    4-wide GCC/Clang vector extensions           kernels_portable.cpp
// kernels() picks the best one the CPU supports (__builtin_cpu_supports, which also checks that the OS
// saves the AVX-512 state). The environment variable BONSAI_CPU_KERNELS=avx512|avx2|portable (or an
// exact variant name) overrides the choice; "avx512" is the family: avx512vnni when present, else avx512bw. A request
// the CPU cannot run falls back to the best supported variant below it, with one line on stderr.
// set_kernels() switches at run time (tests force each path through the ops with it).
//
// Two kinds of ternary kernel:
//   fp32 activations (ternary_rows_x1 / _xm): exact up to fp32 accumulation (~1e-6 relative), but
//   compute-bound far below the memory (decoding 16 codes to floats costs more than streaming them);
//   integer activations ("q8", "q16", "q24": quantize_q8 once per activation site, then
//   ternary_rows_q8_x1 / _xm): the activation is split into L = 1, 2 or 3 int8 digits per element
//   (base 254) under one scale per 128-group; the weights times each digit are exact integer dot products
//   (vpdpbusd: 64 multiply-adds per instruction, the codes decoded once for all digits), combined exactly
//   in int32. L = 1 is plain int8 (~6e-3 relative error per output; the CUDA int8 path fails the
//   whole-model argmax gate with it); L = 2 cuts the rounding 254x; L = 3 is at the fp32 noise floor.
//   Which one ternary_matmul uses is ternary_activation() below.
#pragma once
#include <cstdint>
#include <string_view>

namespace bonsai::cpu {

// ---- integer activation layout (int8 digits) ----------------------------------------------------------
// One activation row x fp32 [K] (K % 128 == 0, G = K/128 groups of 128), L digits (levels), becomes:
//   q     int8  [L, K]  digit l of every element; each digit row is PLANE-PERMUTED within each chunk of
//                       256 elements (two groups; a last odd group forms a chunk of 128): with P = chunk/4
//                       (64, or 32 for the odd tail),
//                         q[l][chunk_base + t*P + p] = digit l of x[chunk_base + 4*p + t],  t = 0..3, p < P.
//                       Why: code byte p of a chunk (the 32 code bytes of each of its blocks, in order)
//                       holds elements 4p..4p+3 at bits 2t, so (codes >> 2t) & 3 over the chunk's P code
//                       bytes is "plane t", whose byte p lines up with q plane t byte p. The weights are
//                       read in their canonical layout (no repack, 1x memory); only the activation, once
//                       per site, is reordered.
//   scale fp32  [G]     s_g = amax_g / 127
//   sum   int32 [L, G]  sum of digit l over the group (maps the unsigned codes c to c - 1:
//                       sum (c-1) q = sum c q - sum q)
// Digits (base 254 = 2 * 127, so that a rounding residual, at most 1/2, times the base fits in int8 with no
// clamp; round to nearest even):
//   v = x * (127 / amax_g);  q0 = rint(v);  r1 = (v - q0) * 254;  q1 = rint(r1);  r2 = (r1 - q1) * 254;
//   q2 = rint(r2);   |q_l| <= 127,   x ~= s_g * (q0 + q1/254 + q2/254^2).
// Per-element error: L=1 s/2, L=2 s/508, L=3 s/129032 (+ the fp32 rounding of v and r1, ~s * 2^-17).
// The kernels combine the digit dots as ((I0 * 254) + I1) * 254 + I2 in int32: |I_l| <= 128 * 2 * 127,
// so the L = 3 total stays below 2^31.
// Several rows (M > 1): q [M, L, K], scale [M, G], sum [M, L, G], row-major.
// Every variant quantises bit-identically (same fp32 ops, same rounding), so the variants differ from
// each other only by fp32 summation order.

struct Kernels {
  const char* name;
  // Unnormalised in-place Sylvester FWHT of one block: x fp32 [n], n a power of two.
  // pre_signs: optional int8 [n] (+-1) multiplied in before the transform; post_signs: optional int8 [n]
  // multiplied in after it; `scale` always multiplies the result (1/sqrt(n) for the rotation).
  void (*fwht_block)(float* x, int64_t n, const int8_t* pre_signs, const int8_t* post_signs, float scale);
  // Weights: W [*, K] as PQ2_0 blocks, `blocks` = row 0; row n's K/128 blocks of 34 bytes (fp16 d, then
  // the 32 code bytes of the canonical layout above) start at blocks + n * (K/128) * 34. No alignment:
  // the code bytes sit at offset 2 of each block (unaligned loads), as a GGUF PQ2_0 tensor holds them.
  // y[n - n0] = sum_e W[n][e] x[e] for rows n0 <= n < n1 (M = 1).
  void (*ternary_rows_x1)(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, float* y);
  // Y[m][n] = sum_e W[n][e] X[m][e] for rows n0 <= n < n1, all m < M; X fp32 [M, K];
  // y points at Y[0][n0] and rows of Y are ldy apart.
  void (*ternary_rows_xm)(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const float* x, int64_t M,
                          float* y, int64_t ldy);
  // fp32 dot product of length n with several partial sums.
  float (*dot)(const float* a, const float* b, int64_t n);

  // One activation row to the digit layout above: x fp32 [K] -> q int8 [levels, K], scale fp32 [K/128],
  // sum int32 [levels, K/128]; levels = 1, 2 or 3.
  void (*quantize_q8)(const float* x, int64_t K, int levels, int8_t* q, float* scale, int32_t* sum);
  // Integer-activation matvec: y[n - n0] = sum_g d[n][g] * s_g * sum_{e in g} (code[n][e] - 1) * xq[e],
  // xq = q0 + q1/254 + q2/254^2 (`levels` digits), rows n0 <= n < n1; q, qscale, qsum: one quantised row.
  void (*ternary_rows_q8_x1)(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                             const float* qscale, const int32_t* qsum, int levels, float* y);
  // GEMM tile: the same for M quantised rows (q [M, levels, K], qscale [M, K/128], qsum [M, levels, K/128]);
  // y as ternary_rows_xm.
  void (*ternary_rows_q8_xm)(const uint8_t* blocks, int64_t K, int64_t n0, int64_t n1, const int8_t* q,
                             const float* qscale, const int32_t* qsum, int levels, int64_t M, float* y, int64_t ldy);

  // The same two on the tiled layout (backend/cpu/tiles.h) of W [N, K], tiles t0 <= t < t1 (rows 16t ..
  // min(16t + 16, N) - 1); y points at output row 0: the x1 form writes y[n], the xm form Y[m][n] at
  // y + m * ldy + n. Arithmetic per output identical to ternary_rows_q8_xm (the same exact integer group
  // dots, the same fp32 ops in the same order), so the tiled and canonical GEMMs agree bit for bit.
  // nullptr in a variant without tiled kernels (the op layer then uses the canonical ones).
  void (*ternary_tiles_q8_x1)(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                              const float* qscale, const int32_t* qsum, int levels, float* y) = nullptr;
  void (*ternary_tiles_q8_xm)(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                              const float* qscale, const int32_t* qsum, int levels, int64_t M, float* y,
                              int64_t ldy) = nullptr;
};

const Kernels& kernels();            // the active variant (chosen at first use; see above)
const char* kernels_name();          // kernels().name: what `bonsai run` / `bonsai bench` print
const Kernels& portable_kernels();   // always the portable one
// The variant with exactly this name ("avx512vnni", "avx512bw", "avx2", "portable") when this build has
// it and this CPU can run it; nullptr otherwise.
const Kernels* find_kernels(const char* name);
// Makes `name` (an exact variant name or "avx512") the active variant; false (nothing changes) when the
// CPU cannot run it. Call it while no op is running.
bool set_kernels(const char* name);

// ---- Activation precision of the ternary ops (ternary_matmul / _multi) --------------------------------
// f32: the fp32-activation kernels (exact to fp32 rounding). q8 / q16 / q24: quantise the activation once
// per call (once per site for ternary_matmul_multi) to 1 / 2 / 3 int8 digits and use the integer kernels.
// Default: q16 on the SIMD variants (the fast path, with a stated looser bound: see kernels.cpp), f32 on
// portable; BONSAI_CPU_ACT=f32|q8|q16|q24 overrides at startup. Measured on the HF fixture (tiny pack, 726
// counted positions): f32 and q24 726/726 (max |dlogit| 2.1e-5 / 1.6e-5), q16 726/726 (2.0e-3, mean KL
// 4.3e-8), q8 691-695/726 (0.45-0.50: fails the gate's 100% rule; its stated looser bound, held by
// HfFixture.CpuQ8PassesItsStatedLooserBound: agreement >= 95%, max |dlogit| <= 0.6, mean KL <= 4e-3).
enum class TernaryActivation { f32, q8, q16, q24 };
inline int activation_levels(TernaryActivation a) { return int(a); }  // 0 for f32, else the digits
inline const char* activation_name(TernaryActivation a) {  // "f32", "q8", "q16", "q24" (BONSAI_CPU_ACT's words)
  constexpr const char* kNames[] = {"f32", "q8", "q16", "q24"};
  return kNames[int(a)];
}
// The precision `word` names ("f32", "q8", "q16", "q24": BONSAI_CPU_ACT's and --act's words); false if none.
inline bool parse_ternary_activation(const char* word, TernaryActivation& out) {
  for (TernaryActivation a : {TernaryActivation::f32, TernaryActivation::q8, TernaryActivation::q16, TernaryActivation::q24})
    if (std::string_view(word) == activation_name(a)) {
      out = a;
      return true;
    }
  return false;
}
TernaryActivation ternary_activation();
void set_ternary_activation(TernaryActivation a);  // call while no op is running

namespace detail {
// Per-ISA tables, defined in kernels_<isa>.cpp; nullptr when the build has no such variant (non-x86).
const Kernels* avx512vnni_kernels();
const Kernels* avx512bw_kernels();
const Kernels* avx2_kernels();
}  // namespace detail

}  // namespace bonsai::cpu
