// Batched-decode ternary product (M = 3..32 tokens; "matvec v7"): int8 tensor cores, mma.sync m16n8k32
// u8.s8, reading the CANONICAL words and scales (no repack) and the site kernel's transposed activation digits.
//
// Why (docs/cuda-kernels.md, round 9): the weight bytes of a step are the same at any M, so at batched decode the
// weights should stream near bandwidth with the M tokens riding along. v3 (warp-specialised wgmma, a 128-token
// tile) spends 40-78 us on gate+up at M = 4..32 against a ~10.5 us read floor; v6 (matvec_mma.cu) gives a column
// to one (token, group, digit) and serves only M <= 2 (q16).
//
// Operands (described per 16 k, m16n8k16-style: A = 16 rows x 16 k, two registers; B = 16 k x 8 columns, one
// register; the kernel issues m16n8k32 = two such k-halves, digits j and j + 1 of one word, half the mmas):
// - A = 16 weight rows (a ROW BLOCK): lane (g = lane / 4, t = lane % 4) loads 8 B = words 2t, 2t + 1 of ONE
//   128-group of row g and of row g + 8. So every k-slot of an mma belongs to the same group (v6's 16 B per lane
//   put lanes t < 2 and t >= 2 in two groups, hence its half-empty columns). A canonical word holds element
//   16i + 4b + j at bits 8b + 2j: `(w >> 2j) & 0x03030303` is 4 codes (elements 16i + 4b + j, b = 0..3), one per
//   byte, UNSCALED: one SHF + one LOP3 per A register, computed once per group and shared by every n-tile (v6's
//   Horner on the accumulator costs 3 SHF per accumulator register: cheaper at one n-tile, not at eight).
// - B = 8 activation PLANES (xq [M, LV, K] is [LV M, K] planes): column n of n-tile nt is plane 8 nt + n, so
//   under q16 an n-tile is 4 tokens x 2 digits and the accumulator lane t holds both digits of token 4 nt + t
//   (columns 2t, 2t + 1); under q8 it is 8 tokens, lane t holds tokens 8 nt + 2t, + 1. No column is wasted
//   (only the planes past LV M of the last n-tile). The mma (j, word q) meets int32 j of transposed activation
//   word 2t + q: a lane loads the 32 B of its two words (2 x 16 B, L1) per (n-tile, group), no shuffles.
// - The -1 of the codes: the accumulator of the digit-1 column (q8: every column) STARTS at -S, the group's digit
//   sum (an exact integer < 2^22), so 254 c0 + c1 = sum((c - 1) Q) with no extra instruction; then per
//   (row, token, group): IMAD, I2FP, FMUL d_w u, FFMA - the same numbers as v6 (exact integer per group, fp32
//   combine (d_w u) x int).
//
// Work split (K-outer): one block per SM owns a balanced contiguous range of row blocks; its warps are NWT tile
// slots x KS K-slices. A warp owns a TILE of RB row blocks and walks its K-slice group by group with the float
// outputs of the tile in registers (RB x NT x (2 | 4) per lane), so every warp of an SM reads the activation of
// the same few groups at a time: they are L1 hits after the first warp (M = 32 q16: 8 KB per group; the whole
// activation, 320 KB at K = 5120, would not stay in L1). More tiles than slots: rounds of NWT tiles, the weight
// ring running on across them. K-slices (KS > 1, for few rows per SM: ffn_down, attn_o) are summed in shared
// memory in slice order after each round (deterministic; no atomics). Weights are loaded D groups ahead in a
// register ring, the first D before griddepcontrol.wait (weights are constants).
//
// Measured (H200, docs/cuda-kernels.md round 9): 1.5-2x faster than v3 at M 3..8 on the products of >= 64 rows per
// SM (gate+up M8 ~40-47 vs 72 us), latency-bound per warp there; slower at M >= 16 (gate+up M32 143 vs 77 us) and on
// the 5,120-row products, so the backend uses it only for the former.
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace bonsai::cuda {
namespace {

struct MvbOut {
  const uint32_t* words;   // u32 [N, K/16] canonical
  const uint16_t* scales;  // fp16 [N, K/128]
  float* y;                // [M, N]
  int64_t N;
  int64_t rb0;             // first 16-row block of this output in the launch's row-block space
};
struct MvbArgs {
  MvbOut o[kMaxOuts];
  const int8_t* xq;    // int8 [M, LV, K] transposed digit planes (ternary.cu header)
  const float2* xds;   // [M, K/64] {unit, digit sum} per 64-element chunk
  int64_t K, M;
  int64_t rbs;         // 16-row blocks of all outputs
  int32_t n_outs;
  int32_t nwt;         // tile slots per block (warps = nwt * ks)
  int32_t ks;          // K slices per tile
  int32_t rounds;      // tiles per slot: ceil(most tiles of a block / nwt)
  int32_t pf;          // L2 prefetch of the weights: 0 none, 1 per group, 2 per chunk (kMvbChunk)
  int32_t pad;
};

// m16n8k32: A = rows g / g + 8 at k 4t.. (a0 / a1) and k 16 + 4t.. (a2 / a3), B = k 4t.. (b0) and 16 + 4t.. (b1).
__device__ __forceinline__ void mma32_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint2 ld_stream2(const uint2* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
// n bytes (a multiple of 16, 16-byte aligned) from p into L2, one request (sm_90).
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t n) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
}
__device__ __forceinline__ uint32_t comp4(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// L2 prefetch of the weights ahead of the register ring, so more bytes are in flight than its registers hold; lane
// (g, t) takes row g + 8 (t % 2) of row block t / 2. MvbArgs::pf 1: one 32-byte sector per row per group,
// kMvbPrefetch groups ahead; 2: chunks of kMvbChunk groups per row (256 B: whole DRAM bursts instead of one
// sector per row per group), the tile's first two chunks when it starts, chunk c + 1 when the ring reaches chunk c.
constexpr int kMvbPrefetch = 8;
constexpr int kMvbChunk = 8;

template <int RB>
struct MvbStage {
  uint2 wa[RB], wb[RB];  // row block b, rows g / g + 8: words 2t, 2t + 1 of the group
  uint32_t sc[RB];       // fp16 scales of the group, rows g | g + 8 (high half)
};

// LV digits per activation element (2: q16, 1: q8); NT n-tiles of 8 planes; RB row blocks of 16 per tile;
// D groups of weights in flight per warp; MAXW: most warps per block (register budget).
template <int LV, int NT, int RB, int D, int MAXW>
__global__ __launch_bounds__(MAXW * 32, 1) void matvec_batch_kernel(const MvbArgs a) {
  constexpr int EPL = LV == 2 ? 2 : 4;  // float outputs per lane per (row block, n-tile)
  constexpr int NV = RB * NT * EPL;     // float outputs per lane
  extern __shared__ float red[];        // [ks - 1][nwt][NV][32] partial outputs of slices 1.. (KS > 1)
  pdl_trigger();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int K = int(a.K), G = K >> 7, KW = K >> 4;  // KW: words per row
  const int nwt = a.nwt, ks = w / nwt, slot = w - ks * nwt;
  const int gs0 = G * ks / a.ks, gs1 = G * (ks + 1) / a.ks;  // this warp's groups [gs0, gs1)
  const int64_t nblk = gridDim.x;
  const int64_t rb_begin = a.rbs * blockIdx.x / nblk, rb_end = a.rbs * (blockIdx.x + 1) / nblk;
  const int rounds = a.rounds;
  // Row block b of the tile of round r (-1: none).
  auto row_block = [&](int r, int b) -> int64_t {
    const int64_t rb = rb_begin + (int64_t(r) * nwt + slot) * RB + b;
    return rb < rb_end ? rb : -1;
  };
  auto out_of = [&](int64_t rb) {
    int o = 0;
#pragma unroll
    for (int i = 1; i < kMaxOuts; ++i)
      if (i < a.n_outs && rb >= a.o[i].rb0) o = i;
    return o;
  };

  // ---- issue cursor (weights) ----
  int ir = 0, ig = gs0;
  const uint2* pw[RB];            // row g of row block b: words 2t, 2t + 1 of group 0
  const unsigned short* psc[RB];  // row g: scale of group 0
  bool va[RB], vb[RB];            // rows g / g + 8 exist
  const uint32_t* ppf = nullptr;  // this lane's L2 prefetch row (null: none)
  auto set_round = [&]() {
    ppf = nullptr;
#pragma unroll
    for (int b = 0; b < RB; ++b) {
      const int64_t rb = ir < rounds ? row_block(ir, b) : -1;
      va[b] = vb[b] = false;
      pw[b] = nullptr;
      psc[b] = nullptr;
      if (rb >= 0) {
        const MvbOut& O = a.o[out_of(rb)];
        const int64_t r = (rb - O.rb0) * 16 + g;
        va[b] = r < O.N;
        vb[b] = r + 8 < O.N;
        pw[b] = reinterpret_cast<const uint2*>(O.words + (va[b] ? r : 0) * KW) + t;
        psc[b] = O.scales + (va[b] ? r : 0) * G;
        if (b == (t >> 1) % RB && (RB == 2 || t < 2) && ((t & 1) ? vb[b] : va[b])) ppf = O.words + (r + 8 * (t & 1)) * KW;
      }
    }
    if (a.pf == 2 && ppf) {  // the tile's first two chunks
      const int n = min(2 * kMvbChunk, gs1 - gs0);
      prefetch_l2_bulk(ppf + 8 * gs0, uint32_t(32 * n));
    }
  };
  auto issue = [&](MvbStage<RB>& st) {
#pragma unroll
    for (int b = 0; b < RB; ++b) {
      st.wa[b] = st.wb[b] = make_uint2(0, 0);
      st.sc[b] = 0;
    }
    if (ir < rounds) {
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const uint2* p = pw[b] + 4 * ig;
        const unsigned short* q = psc[b] + ig;
        if (va[b]) st.wa[b] = ld_stream2(p);
        if (vb[b]) st.wb[b] = ld_stream2(p + 4 * KW);  // row g + 8: 8 KW words = 4 KW uint2 on
        const uint32_t s0 = va[b] ? uint32_t(__ldg(q)) : 0u, s1 = vb[b] ? uint32_t(__ldg(q + 8 * G)) : 0u;
        st.sc[b] = s0 | s1 << 16;
      }
      if (ppf) {
        if (a.pf == 1 && ig + kMvbPrefetch < gs1) prefetch_l2(ppf + 8 * (ig + kMvbPrefetch));
        const int rel = ig - gs0;
        if (a.pf == 2 && rel > 0 && rel % kMvbChunk == 0 && ig + kMvbChunk < gs1) {  // chunk rel / kMvbChunk + 1
          const int g0 = ig + kMvbChunk, n = min(kMvbChunk, gs1 - g0);
          prefetch_l2_bulk(ppf + 8 * g0, uint32_t(32 * n));
        }
      }
      if (++ig == gs1) {
        ig = gs0;
        ++ir;
        set_round();
      }
    }
  };

  MvbStage<RB> ring[D];
  set_round();
#pragma unroll
  for (int s = 0; s < D; ++s) issue(ring[s]);
  pdl_wait();  // the activations and y depend on earlier kernels

  const int64_t M = a.M;
  const int P = int(LV * M);  // planes
  // B role: column g of n-tile nt = plane 8 nt + g; its 32 B of a group at byte 128 gi + 32 t.
  // Accumulator role: q16 token 4 nt + t; q8 tokens 8 nt + 2t, + 1.
  float y[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) y[v] = 0.f;
  const int GS = gs1 - gs0, total = rounds * GS;

  auto flush = [&](int r) {
    // The tile of round r: slices 1.. park their outputs in shared memory, slice 0 adds them in slice order.
    if (a.ks > 1) {
      if (ks > 0) {
#pragma unroll
        for (int v = 0; v < NV; ++v) red[((size_t(ks - 1) * nwt + slot) * NV + v) * 32 + lane] = y[v];
      }
      __syncthreads();
      if (ks == 0)
        for (int k = 1; k < a.ks; ++k)
#pragma unroll
          for (int v = 0; v < NV; ++v) y[v] += red[((size_t(k - 1) * nwt + slot) * NV + v) * 32 + lane];
      __syncthreads();  // the parking space is free for the next round
    }
    if (ks == 0) {
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const int64_t rb = row_block(r, b);
        if (rb < 0) continue;
        const MvbOut& O = a.o[out_of(rb)];
        const int64_t r0 = (rb - O.rb0) * 16 + g;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float* yv = y + (b * NT + nt) * EPL;
          if constexpr (LV == 2) {
            const int64_t m = 4 * nt + t;
            if (m < M) {
              if (r0 < O.N) O.y[m * O.N + r0] = yv[0];
              if (r0 + 8 < O.N) O.y[m * O.N + r0 + 8] = yv[1];
            }
          } else {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int64_t m = 8 * nt + 2 * t + e;
              if (m < M) {
                if (r0 < O.N) O.y[m * O.N + r0] = yv[e];
                if (r0 + 8 < O.N) O.y[m * O.N + r0 + 8] = yv[2 + e];
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int v = 0; v < NV; ++v) y[v] = 0.f;
  };

  int cr = 0, cg = gs0;
  bool live = row_block(0, 0) >= 0;  // the tile of round cr has rows (uniform over the warp)
  for (int base = 0; base < total; base += D) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (base + s < total) {  // uniform over the block's warps of this slice
        const MvbStage<RB>& st = ring[s];
        if (live) {
          // A: unscaled codes, [row block][word q][digit j][row g, g + 8]; shared by every n-tile.
          uint32_t A[RB][2][4][2];
#pragma unroll
          for (int b = 0; b < RB; ++b)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const uint32_t wa = q ? st.wa[b].y : st.wa[b].x, wb = q ? st.wb[b].y : st.wb[b].x;
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                A[b][q][j][0] = (wa >> (2 * j)) & 0x03030303u;
                A[b][q][j][1] = (wb >> (2 * j)) & 0x03030303u;
              }
            }
          float2 dw[RB];  // d_w of rows g, g + 8
#pragma unroll
          for (int b = 0; b < RB; ++b) dw[b] = __half22float2(*reinterpret_cast<const __half2*>(&st.sc[b]));
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int p = 8 * nt + g;
            uint4 X0 = make_uint4(0, 0, 0, 0), X1 = X0;
            if (p < P) {
              const uint4* xp = reinterpret_cast<const uint4*>(a.xq + int64_t(p) * K + cg * 128 + 32 * t);
              X0 = __ldg(xp);
              X1 = __ldg(xp + 1);
            }
            // Units and digit sums of the accumulator's token(s): {u, S of chunk 2gi, u, S of chunk 2gi + 1}.
            float4 ua = make_float4(0.f, 0.f, 0.f, 0.f), ub = ua;
            const int ma = LV == 2 ? 4 * nt + t : 8 * nt + 2 * t;
            if (ma < M) ua = __ldg(reinterpret_cast<const float4*>(a.xds + int64_t(ma) * (K >> 6)) + cg);
            if (LV == 1 && ma + 1 < M) ub = __ldg(reinterpret_cast<const float4*>(a.xds + int64_t(ma + 1) * (K >> 6)) + cg);
            const int Sa = __float2int_rn(ua.y + ua.w), Sb = __float2int_rn(ub.y + ub.w);  // exact: integers < 2^22
#pragma unroll
            for (int b = 0; b < RB; ++b) {
              // -S where the sum (c - 1) Q ends: q16 the digit-1 column (254 c0 + c1), q8 every column.
              int c[4];
              if constexpr (LV == 2) {
                c[0] = 0, c[1] = -Sa, c[2] = 0, c[3] = -Sa;
              } else {
                c[0] = -Sa, c[1] = -Sb, c[2] = -Sa, c[3] = -Sb;
              }
              // k32: digits j, j + 1 of one word, whose B registers are adjacent in the 16-byte load (a B pair
              // from two words would cost MOVs, round 8).
#pragma unroll
              for (int j = 0; j < 4; j += 2) {
                mma32_u8s8(c, A[b][0][j][0], A[b][0][j][1], A[b][0][j + 1][0], A[b][0][j + 1][1], comp4(X0, j), comp4(X0, j + 1));
                mma32_u8s8(c, A[b][1][j][0], A[b][1][j][1], A[b][1][j + 1][0], A[b][1][j + 1][1], comp4(X1, j), comp4(X1, j + 1));
              }
              float* yv = y + (b * NT + nt) * EPL;
              if constexpr (LV == 2) {
                yv[0] += dw[b].x * ua.x * float(c[0] * 254 + c[1]);
                yv[1] += dw[b].y * ua.x * float(c[2] * 254 + c[3]);
              } else {
                yv[0] += dw[b].x * ua.x * float(c[0]);
                yv[1] += dw[b].x * ub.x * float(c[1]);
                yv[2] += dw[b].y * ua.x * float(c[2]);
                yv[3] += dw[b].y * ub.x * float(c[3]);
              }
            }
          }
        }
        issue(ring[s]);  // refill: the group D ahead
        if (++cg == gs1) {
          flush(cr);
          cg = gs0;
          ++cr;
          live = cr < rounds && row_block(cr, 0) >= 0;
        }
      }
    }
  }
}

// Instantiated shapes: NT in {1, 2, 3, 4, 6, 8} (q16: 4 tokens per n-tile), {1, 2, 4} (q8: 8 tokens); RB 1 / 2;
// D = 3 groups in flight in registers with 2 row blocks (32 rows x 32 B = 1 KB per group per warp), 5 with 1, one
// fewer from 4 n-tiles (registers; the L2 prefetch runs further ahead); at most 16 warps per block (128 registers) at 1-2 n-tiles, 12 (168) at 3, 10
// (204) at 4-8: the outputs and the A fragments grow with them (ptxas -v: spills at 128 / 168 otherwise).
constexpr int mvb_d(int rb, int nt) { return rb == 2 ? (nt >= 4 ? 2 : 3) : (nt >= 4 ? 3 : 5); }
constexpr int mvb_maxw(int nt) { return nt >= 4 ? 10 : nt >= 3 ? 12 : 16; }

template <int LV, int NT>
const void* mvb_kernel(int rb) {
  if (rb == 2) return reinterpret_cast<const void*>(&matvec_batch_kernel<LV, NT, 2, mvb_d(2, NT), mvb_maxw(NT)>);
  return reinterpret_cast<const void*>(&matvec_batch_kernel<LV, NT, 1, mvb_d(1, NT), mvb_maxw(NT)>);
}

// The smallest instantiated n-tile count that holds M tokens.
int mvb_nt(int levels, int64_t M) {
  static constexpr int q16[] = {1, 2, 3, 4, 6, 8}, q8[] = {1, 2, 4};
  const int need = int(levels == 2 ? (M + 3) / 4 : (M + 7) / 8);
  if (levels == 2) {
    for (int nt : q16)
      if (nt >= need) return nt;
  } else {
    for (int nt : q8)
      if (nt >= need) return nt;
  }
  return 8;
}

}  // namespace

bool matvec_batch_supported(int64_t M, int levels, int64_t K) {
  return M >= 1 && M <= 32 && (levels == 1 || levels == 2) && K % 128 == 0 && K >= 128 && K <= (int64_t(1) << 20);
}

Launch matvec_batch_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                           int levels, int sms, int rb_cfg, int prefetch) {
  MvbArgs a{};
  a.xq = xq;
  a.xds = xds;
  a.K = K;
  a.M = M;
  a.n_outs = n_outs;
  int64_t rbs = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, rbs};
    rbs += (outs[i].N + 15) / 16;
  }
  a.rbs = rbs;
  const int lv = levels == 2 ? 2 : 1;
  const int nt = mvb_nt(lv, M);
  const int maxw = mvb_maxw(nt);
  const int64_t G = K / 128;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(sms, rbs));
  const int64_t per_block = (rbs + blocks - 1) / blocks;  // most row blocks of a block
  // Row blocks per tile: 2 (A fragments and B loads shared by 32 rows) unless that leaves few tiles per block.
  const int rb = rb_cfg == 1 ? 1 : rb_cfg == 2 ? 2 : per_block >= 8 ? 2 : 1;
  const int64_t tiles = (per_block + rb - 1) / rb;
  int nwt, ksl;
  if (tiles * 2 > maxw) {  // enough tiles: no K split, rounds of at most maxw tiles, as even as possible
    const int64_t rounds = (tiles + maxw - 1) / maxw;
    nwt = int((tiles + rounds - 1) / rounds);
    ksl = 1;
  } else {  // few tiles per block: split K so the SM has warps to hide the loads' latency
    nwt = int(tiles);
    ksl = int(std::min<int64_t>({int64_t(maxw / nwt), G, 8}));
  }
  const int epl = lv == 2 ? 2 : 4;
  const size_t nv = size_t(rb) * nt * epl;
  // The slices' parking space must fit in the default 48 KB of shared memory.
  while (ksl > 1 && size_t(ksl - 1) * nwt * nv * 32 * 4 > 48 * 1024) --ksl;
  a.nwt = nwt;
  a.ks = ksl;
  a.rounds = int((tiles + nwt - 1) / nwt);
  a.pf = prefetch;
  const uint32_t smem = ksl > 1 ? uint32_t(size_t(ksl - 1) * nwt * nv * 32 * 4) : 0;
  const void* f = nullptr;
  if (lv == 2) {
    switch (nt) {
      case 1: f = mvb_kernel<2, 1>(rb); break;
      case 2: f = mvb_kernel<2, 2>(rb); break;
      case 3: f = mvb_kernel<2, 3>(rb); break;
      case 4: f = mvb_kernel<2, 4>(rb); break;
      case 6: f = mvb_kernel<2, 6>(rb); break;
      default: f = mvb_kernel<2, 8>(rb); break;
    }
  } else {
    switch (nt) {
      case 1: f = mvb_kernel<1, 1>(rb); break;
      case 2: f = mvb_kernel<1, 2>(rb); break;
      default: f = mvb_kernel<1, 4>(rb); break;
    }
  }
  return make_launch(f, dim3(unsigned(blocks)), dim3(unsigned(32 * nwt * ksl)), smem, a);
}

}  // namespace bonsai::cuda
