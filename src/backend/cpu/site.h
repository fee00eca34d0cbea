// Fused activation sites of the CPU backend: the producer of a folded linear's input and its sign+FWHT
// rotation in one pass over each row, while the row is in L1/L2 (the unfused ops walk the whole
// [rows, n] activation once per op: add, norm, copy to the site buffer, rotate).
//
// Same numerics as the unfused CPU ops (the same partial-sum dot for the norm, the same FWHT kernel with
// the signs applied on the way in); tests/backend/cpu_site_test.cpp checks them against the reference ops.
// Rows are spread over the thread pool; one row of decode (rows = 1) runs on the caller with no dispatch.
#pragma once
#include <cstdint>

namespace bonsai::cpu {

// The residual site (before q/k/v, qkv/z, gate/up and the head):
//   h     fp32 [rows, n]  in place: h += delta (delta fp32 [rows, n]; nullptr: no add, a plain rmsnorm)
//   out   fp32 [rows, n]  rmsnorm(h) * gain (gain fp32 [n] or nullptr): the un-rotated normed residual
//                         (still read by unfolded readers: GDN's a/b projections)
//   site  fp32 [rows, n]  H (signs ⊙ out) / sqrt(block) per block (hadamard_forward of ops.h)
//   signs int8 [n] (+-1) or nullptr; block a power of two dividing n. No buffer aliases another.
void add_rmsnorm_rotate(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                        float* out, float* site, const int8_t* signs, int64_t block);

// The SwiGLU site (before the down projection):
//   gate, up fp32 [rows, n];  site fp32 [rows, n] = hadamard_forward(silu(gate) * up), silu(g) = g sigmoid(g).
//   site may alias gate or up (each element is read before it is written).
void silu_mul_rotate(const float* gate, const float* up, int64_t rows, int64_t n, float* site, const int8_t* signs,
                     int64_t block);

}  // namespace bonsai::cpu
