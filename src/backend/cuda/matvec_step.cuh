// The ternary tensor-core matvec's STEP (64 B of each of 16 RB rows x two 128-groups, mma.sync u8.s8): matvec v6's and
// v7's (matvec_mma.cu). Fragment layout, the mask / Horner scheme and the per-group combine: matvec_mma.cu's header.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>

namespace bonsai::cuda {
namespace {

// k16: A = rows g / g + 8 at k 4t..4t+3, B = one register: no register pair to assemble for B.
__device__ __forceinline__ void mma16_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint32_t comp(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

template <int RB>
struct Mv6Stage {
  uint4 wa[RB], wb[RB];  // row block b, rows g / g + 8: 16 B at byte 64 s + 16 t
  uint32_t sc[RB];       // fp16 scales of rows g | g + 8 (high half): q16 group 2s + t % 2, q8 group 2s
  uint32_t sc2[RB];      // q8 only: group 2s + 1
};

// The accumulators of a step's RB Horner chains: zeroed, and the exact >> 2 between two code positions.
template <int RB>
__device__ __forceinline__ void mv_acc_zero(int (&cc)[RB][4]) {
#pragma unroll
  for (int b = 0; b < RB; ++b)
#pragma unroll
    for (int i = 0; i < 4; ++i) cc[b][i] = 0;
}
template <int RB>
__device__ __forceinline__ void mv_acc_next_position(int (&cc)[RB][4]) {
#pragma unroll
  for (int b = 0; b < RB; ++b)
#pragma unroll
    for (int i = 0; i < 4; ++i) cc[b][i] >>= 2;
}

// The per-group combine of a step: y += d_w u (sum(c Q) - S) into the rows g (yg) and g + 8 (yg8) from the
// accumulators cc (columns 2t, 2t + 1 of the lane). Zero scales (a missing group or row) add nothing.
template <int LV, int RB>
__device__ __forceinline__ void mv6_combine(const Mv6Stage<RB>& st, const int (&cc)[RB][4], const float4& xv0,
                                            const float4& xv1, float (&yg)[RB], float (&yg8)[RB]) {
#pragma unroll
  for (int b = 0; b < RB; ++b) {
    const int (&c)[4] = cc[b];
    const float2 dw = __half22float2(*reinterpret_cast<const __half2*>(&st.sc[b]));
    if constexpr (LV == 2) {
      const float S2 = xv0.y + xv0.w;
      yg[b] += dw.x * xv0.x * (float(c[0] * 254 + c[1]) - S2);
      yg8[b] += dw.y * xv0.x * (float(c[2] * 254 + c[3]) - S2);
    } else {
      const float S0 = xv0.y + xv0.w, S1 = xv1.y + xv1.w;
      const float2 dw1 = __half22float2(*reinterpret_cast<const __half2*>(&st.sc2[b]));
      yg[b] += dw.x * xv0.x * (float(c[0]) - S0);
      yg8[b] += dw.y * xv0.x * (float(c[2]) - S0);
      yg[b] += dw1.x * xv1.x * (float(c[1]) - S1);
      yg8[b] += dw1.y * xv1.x * (float(c[3]) - S1);
    }
  }
}

// One step of a tile (both kernels): for each row block, the 16 mmas of the 4 words x 4 code positions (Horner
// over j: the accumulator >> 2 between positions is exact, a multiple of 4), then the per-group combine
// y += d_w u (sum(c Q) - S) into the rows g (yg) and g + 8 (yg8). Zero scales (a missing group or row) add nothing.
// X: the lane's 4 transposed activation words; xv0 / xv1: {u, S, u, S} of its accumulator groups.
// (Round 14, not kept: -64 S as the accumulators' start instead of the float subtract saves the 4 FADDs of a step but
// costs 8 register moves, the first mma no longer starting from RZ.)
template <int LV, int RB>
__device__ __forceinline__ void mv6_step(const Mv6Stage<RB>& st, const uint4 (&X)[4], const float4& xv0, const float4& xv1,
                                         float (&yg)[RB], float (&yg8)[RB]) {
  // (Round 14: the chains cut in two, positions j = 3, 2 and j = 1, 0 combined as hi / 16 + lo, which ptxas does
  // interleave, measured slower in the model: 197.9 vs 204.4 tok/s; ptxas issues one row block's chain after the
  // other's whatever the source order. Round 28, on v7: 2 and 4 independent chains per step, interleaved in the SASS:
  // ffn_down 12.88 -> 12.58 us back to back, the others level or slower, tg128 235.6 vs 236.5: the chain's latency is
  // not what holds v7; removed.)
  int cc[RB][4];
  mv_acc_zero(cc);
#pragma unroll
  for (int j = 3; j >= 0; --j) {
    const uint32_t m = 0x03030303u << (2 * j);
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int b = 0; b < RB; ++b) mma16_u8s8(cc[b], comp(st.wa[b], q) & m, comp(st.wb[b], q) & m, comp(X[q], j));
    if (j > 0) mv_acc_next_position(cc);
  }
  mv6_combine<LV, RB>(st, cc, xv0, xv1, yg, yg8);
}

// ---- round 15: the same step on m16n8k32 (v7's plain instances) ----------------------------------------------------
// One m16n8k32 takes words q and q' = q + 1 of a lane as its two k16 halves (A: rows g / g + 8 of word q, then of word
// q'), so a step issues 8 mmas per row block instead of 16 and each Horner chain is 8 deep instead of 16. The integer
// sums are the same (exact int32 adds in another grouping): bit-identical to mv6_step. Its B is a register PAIR
// (b0 = word q's int32 j, b1 = word q''s), which sm_90 wants in two adjacent registers: the lane's 4 activation words
// are held in pair order (mv7_pair_order) so every pair is one half of a uint4 (no register moves per mma).
__device__ __forceinline__ void mma32_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The pair order of a lane's 4 activation words X[q] (int32 j of word q = element group (q, j)):
// XP[2p + j / 2] = {X[2p].j0, X[2p + 1].j0, X[2p].j1, X[2p + 1].j1} with j0 = 2 (j / 2), j1 = j0 + 1. As a
// permutation of the 16 int32 of a 64-byte block: destination 4r + c takes source 4q + j with r = 2 (q / 2) + j / 2,
// c = 2 (j % 2) + q % 2 (matvec7_kernel's staging copy applies it with a pair exchange between neighbouring lanes).
__device__ __forceinline__ void mv7_pair_order(const uint4 (&X)[4], uint4 (&XP)[4]) {
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    XP[2 * p] = make_uint4(X[2 * p].x, X[2 * p + 1].x, X[2 * p].y, X[2 * p + 1].y);
    XP[2 * p + 1] = make_uint4(X[2 * p].z, X[2 * p + 1].z, X[2 * p].w, X[2 * p + 1].w);
  }
}

template <int LV, int RB>
__device__ __forceinline__ void mv7_step32(const Mv6Stage<RB>& st, const uint4 (&XP)[4], const float4& xv0,
                                           const float4& xv1, float (&yg)[RB], float (&yg8)[RB]) {
  int cc[RB][4];
  mv_acc_zero(cc);
#pragma unroll
  for (int j = 3; j >= 0; --j) {
    const uint32_t m = 0x03030303u << (2 * j);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const uint4& xb = XP[2 * p + (j >> 1)];
      const uint32_t b0 = (j & 1) ? xb.z : xb.x, b1 = (j & 1) ? xb.w : xb.y;
#pragma unroll
      for (int b = 0; b < RB; ++b)
        mma32_u8s8(cc[b], comp(st.wa[b], 2 * p) & m, comp(st.wb[b], 2 * p) & m, comp(st.wa[b], 2 * p + 1) & m,
                   comp(st.wb[b], 2 * p + 1) & m, b0, b1);
    }
    if (j > 0) mv_acc_next_position(cc);
  }
  mv6_combine<LV, RB>(st, cc, xv0, xv1, yg, yg8);
}

// ---- round 31: one token's B fragment and a step over a window of a row's columns (ffn_fused.cu; the decode delta
// step's out projection, delta_rule.cu) ------------------------------------------------------------------------
// A lane's fragment roles for ONE token (v7's with M = 1): it loads B columns of token 0 (b_on: level bl, group bg of
// the step's pair), the token's group units (c_on), and holds the summed rows of its accumulators (holder).
template <int LV>
struct Mv7OneToken {
  int g, t, bl, bg;
  bool b_on, c_on, holder;
  __device__ __forceinline__ explicit Mv7OneToken(int lane) {
    g = lane >> 2;
    t = lane & 3;
    const int bm = LV == 2 ? g >> 2 : g >> 1;
    bl = LV == 2 ? g & 1 : 0;
    bg = LV == 2 ? (g >> 1) & 1 : g & 1;
    b_on = bg == (t >> 1) && bm == 0;
    c_on = (LV == 2 ? t >> 1 : t) == 0;
    holder = c_on && (LV == 1 || (t & 1) == 0);
  }
  // The lane's B fragment XP (pair order) and group units xv0 / xv1 of step cc of a K-long activation: digits xq
  // [LV][K] (level stride K), units xds [K / 64] (v7's load_b with M = 1).
  __device__ __forceinline__ void load_b(int cc, int K, const int8_t* xq, const float2* xds, uint4 (&XP)[4],
                                         float4& xv0, float4& xv1) const {
    const int GK = K >> 7;
    const uint4* xp = reinterpret_cast<const uint4*>(xq + (b_on ? bl * K + bg * 128 + 64 * (t & 1) : 0)) + 16 * cc;
    const int cs_b = b_on ? (GK - bg + 1) >> 1 : 0;
    uint4 X[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) X[i] = cc < cs_b ? xp[i] : make_uint4(0, 0, 0, 0);
    mv7_pair_order(X, XP);
    const float4* xd = reinterpret_cast<const float4*>(xds);
    const int cs_c = c_on ? (LV == 2 ? (GK - (t & 1) + 1) >> 1 : (GK + 1) >> 1) : 0;
    xv0 = xv1 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (cc < cs_c) {
      xv0 = xd[LV == 2 ? 2 * cc + (t & 1) : 2 * cc];
      if (LV == 1 && 2 * cc + 1 < GK) xv1 = xd[2 * cc + 1];
    }
  }
};

// One step of RB 16-row blocks over a window of GR 128-groups: block b's rows g / g + 8 at wrow + b bstride (row
// stride rs bytes, wrow already at the lane's 16 t), its scales at srow + b sstride (row stride srs fp16); the lane's
// step cc (matvec v7's fragment roles), partial rows into yg / yg8.
template <int LV, int RB>
__device__ __forceinline__ void mv7_window_step(const unsigned char* wrow, int bstride, int rs, const uint16_t* srow,
                                                int sstride, int srs, int GR, int cc, int t, const uint4 (&XP)[4],
                                                const float4& xv0, const float4& xv1, float (&yg)[RB],
                                                float (&yg8)[RB]) {
  Mv6Stage<RB> sv;
  const int lim_s = LV == 2 ? (GR - (t & 1) + 1) >> 1 : (GR + 1) >> 1;
#pragma unroll
  for (int b = 0; b < RB; ++b) {
    const unsigned char* wb = wrow + b * bstride;
    sv.wa[b] = *reinterpret_cast<const uint4*>(wb + 64 * cc);
    sv.wb[b] = *reinterpret_cast<const uint4*>(wb + 8 * rs + 64 * cc);
    const uint16_t* q = srow + b * sstride + 2 * cc;
    sv.sc[b] = cc < lim_s ? uint32_t(q[0]) | uint32_t(q[8 * srs]) << 16 : 0u;
    if constexpr (LV == 1) sv.sc2[b] = cc < (GR >> 1) ? uint32_t(q[1]) | uint32_t(q[8 * srs + 1]) << 16 : 0u;
  }
  mv7_step32<LV, RB>(sv, XP, xv0, xv1, yg, yg8);
}

// A warp's partial rows of a step into p (+ g: lane (g, t) holds rows g, g + 8 of each block b at 16 b), by the holder
// lanes; under q16 lanes t, t ^ 1 hold the two groups of the token first.
template <int LV, int RB>
__device__ __forceinline__ void mv7_put_rows(float* p, bool holder, float (&yg)[RB], float (&yg8)[RB]) {
#pragma unroll
  for (int b = 0; b < RB; ++b) {
    if constexpr (LV == 2) {
      yg[b] += __shfl_xor_sync(0xffffffffu, yg[b], 1);
      yg8[b] += __shfl_xor_sync(0xffffffffu, yg8[b], 1);
    }
    if (holder) {
      p[16 * b] = yg[b];
      p[16 * b + 8] = yg8[b];
    }
  }
}

}  // namespace
}  // namespace bonsai::cuda
