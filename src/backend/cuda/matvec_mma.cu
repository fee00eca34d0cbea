// Ternary matvec v6 (decode: M <= 2 under q16, M <= 4 under q8) on the int8 tensor cores:
// mma.sync.m16n8k16.row.col.s32.u8.s8.s32, reading the CANONICAL words and scales (no repack: device memory
// stays the pack's, and the prefill GEMMs read the same bytes).
//
// Why (docs/cuda-kernels.md, round 8): v3 spends ~2.1 thread-instructions per weight (4 LOP3 + 8 dp4a per
// 16 weights under q16, plus the ring's address arithmetic and a float combine per 64-weight chunk) and is
// issue/latency-bound at 22-39 % of the read probe. Here one mma does the work of 32 dp4a.
//
// Fragments (m16n8k16: A = 16 rows x 16 k, two registers; B = 16 k x 8 columns, one register). Lane
// (g = lane / 4, t = lane % 4) loads 16 B of row g and 16 B of row g + 8 at byte 64 s + 16 t of the row: one
// STEP = 64 B of each row = two 128-groups; lanes t = 0, 1 hold group 2s (words 0-3 / 4-7), lanes t = 2, 3
// group 2s + 1. A canonical word holds element 16i + 4b + j at bits 8b + 2j, so `w & (0x03030303 << 2j)` is 4
// codes (elements 16i + 4b + j, b = 0..3) scaled by 4^j in 4 bytes: ONE LOP3 per A register. The mma for
// (j, word q) takes word q of each lane (k 4t..4t+3); its B must hold, at the same k, the activation of those
// elements: in the site kernel's transposed layout (ternary.cu) that is int32 j of the word's 16 bytes, so B
// needs no shuffle: a lane loads the 64 B of its 4 words (4 x 16 B, L1-resident). (m16n8k32 would take two
// words per register pair; its B pair (word q, j), (word q', j) is not adjacent in memory, and assembling
// it cost 2 MOVs per mma in the SASS: k16 issues twice the mmas and no MOVs.)
// Columns: the k-slots of lanes t = 0, 1 are group 2s, of t = 2, 3 group 2s + 1, so a column is given ONE
// group and is zero on the other half of k: q16 column n = (token n / 4, group (n / 2) % 2, digit n % 2); q8:
// (token n / 2, group n % 2). The accumulator lane t then holds columns 2t, 2t + 1: under q16 the two digits
// of one (token, group), under q8 the two groups of token t: every accumulator lane is useful at M = 2 (q16)
// / 4 (q8), half of them at M = 1.
// Scale 4^j: Horner on the accumulator: mma(j = 3), >> 2, mma(j = 2), >> 2, ... exact (a multiple of 4
// before each shift): 3 SHF per accumulator register per step instead of one per A register.
// Per group: int32 -> float, minus the group's digit sum S (codes are c = w + 1), times d_w * u. Exact up
// to the float products: |254 I0 + I1 - S| < 2^24 even with code 3.
//
// Work split: a tile = RB blocks of 16 rows (they share the B loads, the activation units and the loop); one
// block per SM owns a balanced contiguous range of tiles. Two ways to give the block's tiles to its warps:
// - lockstep (matvec6l_kernel, the default, cfg 5-7): the NW warps walk each tile together, warp w taking steps
//   w, w + NW, ... (NW <= 20 chosen so the steps divide evenly), so a block reads a contiguous stretch of its
//   tile (16 rows are one contiguous block of canonical words); partials per tile in shared memory, summed in
//   warp order every few tiles after one barrier. With one step per tile (K = 5120) a warp's B is loaded once.
// - contiguous (matvec6_kernel, cfg 1-4): each warp a balanced contiguous range of the block's (tile, step)
//   pairs; tiles cut between warps summed in shared memory after one barrier, in warp order.
// Both deterministic. D steps of weight loads in flight per warp in a register ring (RB x (16 + 16 + 4) B per
// lane and step), issued before griddepcontrol.wait (weights are constants); no L2 prefetch hook
// (matvec_set_prefetch leaves v6 launches alone). Measured per shape in docs/cuda-kernels.md, round 8.
// v7 (round 10, matvec7_kernel, cfg 8-10; Options::matvec7 / BONSAI_CUDA_MV7=1 for cfg 0): the same mma step, its
// fragments read from a shared-memory ring that one producer warp fills with bulk copies of whole row stages (below).
// Split-K (round 9c, Options::matvec6_split, off by default: slower than v3 on ffn_down): one product's K cut into S
// slices, each slice one more output of the tile space (row strides and activation offsets from the full K); each
// slice's partial y goes to scratch, and the last block to arrive at a row tile (an int32 counter per row tile,
// reset by that block) sums the slices in slice order: deterministic, no float atomics.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>

#include "backend/cuda/block_trace.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/matvec_step.cuh"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/warp_site.cuh"

namespace bonsai::cuda {
namespace {

struct Mv6Out {
  const uint32_t* words;   // u32 [N, K/16] canonical
  const uint16_t* scales;  // fp16 [N, K/128]
  float* y;                // [M, N]
  int64_t N;
  int64_t t0;              // first tile (16 RB rows) of this output in the launch's tile space
  int64_t k0;              // split-K: the slice's first element in the activations (words / scales start there)
};
struct Mv6Args {
  Mv6Out o[kMaxOuts];
  const int8_t* xq;    // int8 [M, LV, Kx] transposed digit planes (ternary.cu header)
  const float2* xds;   // [M, Kx/64] {unit, digit sum} per 64-element chunk
  int64_t K, M;        // K: elements each output's tiles walk (the slice under split-K)
  int64_t Kr, Kx;      // row length of the weights (words per row Kr/16, scales Kr/128) and of the activations;
                       // both = K except under split-K (the full K)
  int64_t tiles;       // tiles of all outputs
  int32_t n_outs, split;  // split > 1 (lockstep kernel only): the outputs are the K slices of ONE product, their
                          // y partials [M, N] that the last block to finish a row tile sums in slice order into ysum
  int32_t ilv, pad;       // split-K tile order: 1 = row tile major (tile = row tile x split + slice: a block's tiles
                          // are contiguous stretches of the same rows), 0 = slice major (tile = slice x row tiles +
                          // row tile: output z's tiles from o[z].t0)
  float* ysum;         // [M, N] split-K: the product's y
  int32_t* count;      // [N / 16 rows] split-K arrival counters, zero between launches (the last arrival resets)
};

// LV digits per activation element (2: q16, 1: q8), RB row blocks of 16 per tile (they share the B loads
// and the loop), D steps in flight per warp, NW warps per block.
template <int LV, int RB, int D, int NW>
__global__ __launch_bounds__(NW * 32, 1) void matvec6_kernel(const Mv6Args a) {
  constexpr int kTok = LV == 2 ? 2 : 4;          // tokens one n-tile of 8 columns carries
  constexpr int TR = 16 * RB;                    // rows per tile
  __shared__ float red[NW][2][kTok][TR];         // cut tiles: [warp][its first / last tile][token][row]
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // 32-bit step / tile arithmetic (registers): K <= 2^20, (tile, step) pairs of a block < 2^31.
  const int K = int(a.K), G = K >> 7, S = (G + 1) >> 1;  // S: steps (two groups each) per tile
  const int64_t nblk = gridDim.x;
  const int tb0 = int(a.tiles * blockIdx.x / nblk), tb1 = int(a.tiles * (blockIdx.x + 1) / nblk);
  const int RS = (tb1 - tb0) * S;                                        // (tile, step) pairs of the block
  const int x0 = int(int64_t(RS) * w / NW), x1 = int(int64_t(RS) * (w + 1) / NW);  // this warp's, relative to tb0

  // ---- issue cursor (weights) ----
  // Running pointers, advanced one step (64 B of words, 2 scales) per issue; reset when the tile changes.
  // A lane's A words exist while is < lim_a (its group 2 is + t / 2 < G), its scales while is < lim_s.
  const int rs_w = 8 * (K >> 6), rs_s = 8 * G;  // uint4 / halves from row g to row g + 8
  const int lim_a = (G - (t >> 1) + 1) >> 1;
  const int lim_s = LV == 2 ? (G - (t & 1) + 1) >> 1 : S, lim_s2 = G >> 1;  // q8: group 2 is + 1 while is < lim_s2
  int ix = x0, it = x0 / S, is = x0 - (x0 / S) * S;
  const uint4* pa = nullptr;            // row g of the tile: words at byte 64 is + 16 t
  const unsigned short* ps = nullptr;   // row g: scale of the lane's (first) accumulator group
  int nrow = 0;                         // rows of the tile that exist (< TR only for the last tile of an output)
  auto set_tile = [&]() {
    if (ix >= x1) return;
    const int64_t tile = int64_t(tb0) + it;
    int o = 0;
#pragma unroll
    for (int i = 1; i < kMaxOuts; ++i)
      if (i < a.n_outs && tile >= a.o[i].t0) o = i;
    const Mv6Out& O = a.o[o];
    const int64_t r0 = (tile - O.t0) * TR;
    nrow = int(min(int64_t(TR), O.N - r0));
    pa = reinterpret_cast<const uint4*>(O.words + (r0 + g) * (K >> 4)) + t + 4 * is;
    ps = O.scales + (r0 + g) * G + 2 * is + (LV == 2 ? (t & 1) : 0);
  };
  auto issue = [&](Mv6Stage<RB>& st) {
    // Fast path (uniform over the warp): a whole tile and a step whose two groups exist: plain loads, no
    // predicates and no zeroing.
    if (ix < x1 && nrow == TR && 2 * is + 1 < G) {
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const uint4* p = pa + 2 * b * rs_w;
        const unsigned short* q = ps + 2 * b * rs_s;
        st.wa[b] = ld_stream(p);
        st.wb[b] = ld_stream(p + rs_w);
        st.sc[b] = uint32_t(__ldg(q)) | uint32_t(__ldg(q + rs_s)) << 16;
        if constexpr (LV == 1) st.sc2[b] = uint32_t(__ldg(q + 1)) | uint32_t(__ldg(q + rs_s + 1)) << 16;
      }
    } else {
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        st.wa[b] = st.wb[b] = make_uint4(0, 0, 0, 0);
        st.sc[b] = st.sc2[b] = 0;
      }
      if (ix < x1) {
#pragma unroll
        for (int b = 0; b < RB; ++b) {
          const bool va = 16 * b + g < nrow, vb = 16 * b + g + 8 < nrow;
          const uint4* p = pa + 2 * b * rs_w;
          const unsigned short* q = ps + 2 * b * rs_s;
          if (va && is < lim_a) st.wa[b] = ld_stream(p);
          if (vb && is < lim_a) st.wb[b] = ld_stream(p + rs_w);
          const uint32_t s0 = va && is < lim_s ? uint32_t(__ldg(q)) : 0u, s1 = vb && is < lim_s ? uint32_t(__ldg(q + rs_s)) : 0u;
          st.sc[b] = s0 | s1 << 16;
          if constexpr (LV == 1) {
            const uint32_t s2 = va && is < lim_s2 ? uint32_t(__ldg(q + 1)) : 0u;
            const uint32_t s3 = vb && is < lim_s2 ? uint32_t(__ldg(q + rs_s + 1)) : 0u;
            st.sc2[b] = s2 | s3 << 16;
          }
        }
      }
    }
    if (ix < x1) {
      pa += 4;
      ps += 2;
      ++ix;
      if (++is == S) {
        is = 0;
        ++it;
        set_tile();
      }
    }
  };

  Mv6Stage<RB> ring[D];
  set_tile();
#pragma unroll
  for (int s = 0; s < D; ++s) issue(ring[s]);  // weights first: they do not depend on earlier kernels
  pdl_trigger();
  pdl_wait();  // the activations and y do

  const int64_t M = a.M;
  // B role of this lane: column n = g. Active when its group is the group of this lane's k-slots.
  const int bm = LV == 2 ? g >> 2 : g >> 1, bl = LV == 2 ? g & 1 : 0, bg = LV == 2 ? (g >> 1) & 1 : g & 1;
  const bool b_on = bg == (t >> 1) && bm < M;
  // B of step cs: 64 B at xbp + 16 cs (uint4), loaded while cs < cs_b (its group exists, the lane is active).
  const uint4* xbp = reinterpret_cast<const uint4*>(a.xq + (b_on ? (int64_t(bm) * LV + bl) * K + bg * 128 + 64 * (t & 1) : 0));
  const int cs_b = b_on ? (G - bg + 1) >> 1 : 0;
  // Accumulator role: columns 2t, 2t + 1.
  const int cm = LV == 2 ? t >> 1 : t;  // token
  const bool c_on = cm < M;
  const float4* xd = reinterpret_cast<const float4*>(a.xds) + int64_t(c_on ? cm : 0) * (K >> 7);
  // q16: the accumulator's group 2 cs + t % 2 exists while cs < cs_c (q8: group 2 cs).
  const int cs_c = c_on ? (LV == 2 ? (G - (t & 1) + 1) >> 1 : (G + 1) >> 1) : 0;

  // ---- compute cursor ----
  int ct = x0 / S, cs = x0 - (x0 / S) * S;
  const int first_tile = ct;
  float yg[RB], yg8[RB];
#pragma unroll
  for (int b = 0; b < RB; ++b) yg[b] = yg8[b] = 0.f;
  auto finish_tile = [&](int tile_rel) {
    // q16: lanes t, t ^ 1 hold the two groups of one token: add them.
    if constexpr (LV == 2) {
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        yg[b] += __shfl_xor_sync(0xffffffffu, yg[b], 1);
        yg8[b] += __shfl_xor_sync(0xffffffffu, yg8[b], 1);
      }
    }
    const bool holder = c_on && (LV == 1 || (t & 1) == 0);
    const int64_t tile = int64_t(tb0) + tile_rel;
    const bool whole = tile_rel * S >= x0 && tile_rel * S + S <= x1;
    if (whole) {
      int o = 0;
#pragma unroll
      for (int i = 1; i < kMaxOuts; ++i)
        if (i < a.n_outs && tile >= a.o[i].t0) o = i;
      const Mv6Out& O = a.o[o];
      const int64_t r = (tile - O.t0) * TR + g;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        if (holder && r + 16 * b < O.N) O.y[cm * O.N + r + 16 * b] = yg[b];
        if (holder && r + 16 * b + 8 < O.N) O.y[cm * O.N + r + 16 * b + 8] = yg8[b];
      }
    } else if (holder) {
      const int slot = tile_rel == first_tile ? 0 : 1;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        red[w][slot][cm][16 * b + g] = yg[b];
        red[w][slot][cm][16 * b + g + 8] = yg8[b];
      }
    }
#pragma unroll
    for (int b = 0; b < RB; ++b) yg[b] = yg8[b] = 0.f;
  };

  for (int base = x0; base < x1; base += D) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (base + s < x1) {  // uniform across the warp
        const Mv6Stage<RB>& st = ring[s];
        // B: the 4 transposed words of this lane's k-slots (zero when the column's group differs).
        uint4 X[4];
        if (cs < cs_b) {
          const uint4* xp = xbp + 16 * cs;
#pragma unroll
          for (int i = 0; i < 4; ++i) X[i] = xp[i];
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) X[i] = make_uint4(0, 0, 0, 0);
        }
        float4 xv0 = make_float4(0.f, 0.f, 0.f, 0.f), xv1 = xv0;  // {u, S, u, S} of the accumulator groups
        if (cs < cs_c) {
          xv0 = xd[LV == 2 ? 2 * cs + (t & 1) : 2 * cs];
          if (LV == 1 && 2 * cs + 1 < G) xv1 = xd[2 * cs + 1];
        }
        mv6_step<LV, RB>(st, X, xv0, xv1, yg, yg8);
        issue(ring[s]);  // refill: the step D ahead
        const bool last = base + s + 1 == x1;
        if (++cs == S || last) {
          finish_tile(ct);
          if (cs == S) {
            cs = 0;
            ++ct;
          }
        }
      }
    }
  }

  // Tiles cut between warps: the warp holding a tile's last step sums the partials in warp order.
  __syncthreads();
  if (x1 > x0 && x0 % S != 0) {
    const int tau = x0 / S;  // this warp's first tile began in an earlier warp
    if (tau * S + S <= x1) { // ... and ends here: this warp owns it
      // first contributor: the warp holding step tau * S (the largest w with RS w / NW <= x)
      const int64_t xs = int64_t(tau) * S;
      const int wf = int(((xs + 1) * NW + RS - 1) / RS - 1);
      const int64_t tile = int64_t(tb0) + tau;
      int o = 0;
#pragma unroll
      for (int i = 1; i < kMaxOuts; ++i)
        if (i < a.n_outs && tile >= a.o[i].t0) o = i;
      const Mv6Out& O = a.o[o];
      for (int e = lane; e < kTok * TR; e += 32) {
        const int m = e / TR, rr = e % TR;
        const int64_t r = (tile - O.t0) * TR + rr;
        if (m >= M || r >= O.N) continue;
        float v = 0.f;
        for (int ww = wf; ww <= w; ++ww) {
          const int wx0 = int(int64_t(RS) * ww / NW);
          if (int(int64_t(RS) * (ww + 1) / NW) == wx0) continue;  // an empty range wrote nothing
          v += red[ww][wx0 / S == tau ? 0 : 1][m][rr];
        }
        O.y[m * O.N + r] = v;
      }
    }
  }
}

// Lockstep variant (cfg 5-7): the block's warps walk the SAME tile together, warp w taking steps w, w + NW,
// ... of it (NW <= S chosen at launch so the steps divide evenly), so at any moment a block reads one
// contiguous stretch of each of the tile's rows (a 16-row tile is one contiguous block of the canonical
// words): DRAM pages are read whole instead of 64 B at a time by warps far apart in K. Every warp ends every
// tile: its partials go to shared memory, and every TB tiles one barrier, then the block sums the batch in
// warp order (deterministic) and writes it; two batch buffers, so one barrier per batch.
constexpr int kLsMaxWarps = 20;
// SPLIT: the split-K launch (a.split > 1; its own instantiation, so the plain one keeps its registers).
template <int LV, int RB, int D, bool SPLIT = false>
__global__ __launch_bounds__(kLsMaxWarps * 32, 1) void matvec6l_kernel(const Mv6Args a) {
  constexpr int kTok = LV == 2 ? 2 : 4;
  constexpr int TR = 16 * RB;
  constexpr int TB = (LV == 2 ? 4 : 2) / RB > 0 ? (LV == 2 ? 4 : 2) / RB : 1;  // tiles per batch (<= 25 KB of partials)
  __shared__ float red[2][TB][kLsMaxWarps][kTok][TR];
  const int NW = int(blockDim.x >> 5);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int K = int(a.K), G = K >> 7, S = (G + 1) >> 1;
  const int64_t nblk = gridDim.x;
  const int tb0 = int(a.tiles * blockIdx.x / nblk), tb1 = int(a.tiles * (blockIdx.x + 1) / nblk);
  const int nt = tb1 - tb0;
  const int ns = (S - w + NW - 1) / NW;  // this warp's steps per tile (>= 1: NW <= S)
  const int total = nt * ns;
  // Tile -> its output o and row tile rt (tiles of output o from o.t0, or split-K's row tile major order).
  auto locate = [&](int64_t tile, int& o, int64_t& rt) {
    if (SPLIT && a.ilv) {
      o = int(tile % a.split);
      rt = tile / a.split;
      return;
    }
    o = 0;
#pragma unroll
    for (int i = 1; i < kMaxOuts; ++i)
      if (i < a.n_outs && tile >= a.o[i].t0) o = i;
    rt = tile - a.o[o].t0;
  };

  const int Kr = SPLIT ? int(a.Kr) : K;
  const int rs_w = 8 * (Kr >> 6), rs_s = 8 * (Kr >> 7);
  const int lim_a = (G - (t >> 1) + 1) >> 1;
  const int lim_s = LV == 2 ? (G - (t & 1) + 1) >> 1 : S, lim_s2 = G >> 1;
  int ix = 0, it = 0, is = w;
  const uint4* pa = nullptr;           // row g of the tile, step 0: words at byte 16 t
  const unsigned short* ps = nullptr;  // row g, group 0 (+ t % 2 under q16)
  int nrow = 0;
  auto set_tile = [&]() {
    if (ix >= total) return;
    int o;
    int64_t rt;
    locate(int64_t(tb0) + it, o, rt);
    const Mv6Out& O = a.o[o];
    const int64_t r0 = rt * TR;
    nrow = int(min(int64_t(TR), O.N - r0));
    pa = reinterpret_cast<const uint4*>(O.words + (r0 + g) * (Kr >> 4)) + t;
    ps = O.scales + (r0 + g) * (Kr >> 7) + (LV == 2 ? (t & 1) : 0);
  };
  auto issue = [&](Mv6Stage<RB>& st) {
#pragma unroll
    for (int b = 0; b < RB; ++b) {
      st.wa[b] = st.wb[b] = make_uint4(0, 0, 0, 0);
      st.sc[b] = st.sc2[b] = 0;
    }
    if (ix < total) {
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const bool va = 16 * b + g < nrow, vb = 16 * b + g + 8 < nrow;
        const uint4* p = pa + 2 * b * rs_w + 4 * is;
        const unsigned short* q = ps + 2 * b * rs_s + 2 * is;
        if (va && is < lim_a) st.wa[b] = ld_stream(p);
        if (vb && is < lim_a) st.wb[b] = ld_stream(p + rs_w);
        const uint32_t s0 = va && is < lim_s ? uint32_t(__ldg(q)) : 0u, s1 = vb && is < lim_s ? uint32_t(__ldg(q + rs_s)) : 0u;
        st.sc[b] = s0 | s1 << 16;
        if constexpr (LV == 1) {
          const uint32_t s2 = va && is < lim_s2 ? uint32_t(__ldg(q + 1)) : 0u;
          const uint32_t s3 = vb && is < lim_s2 ? uint32_t(__ldg(q + rs_s + 1)) : 0u;
          st.sc2[b] = s2 | s3 << 16;
        }
      }
      ++ix;
      is += NW;
      if (is >= S) {
        is = w;
        ++it;
        set_tile();
      }
    }
  };

  Mv6Stage<RB> ring[D];
  set_tile();
#pragma unroll
  for (int s = 0; s < D; ++s) issue(ring[s]);
  pdl_trigger();
  pdl_wait();

  const int64_t M = a.M;
  const int bm = LV == 2 ? g >> 2 : g >> 1, bl = LV == 2 ? g & 1 : 0, bg = LV == 2 ? (g >> 1) & 1 : g & 1;
  const bool b_on = bg == (t >> 1) && bm < M;
  const int64_t Kx = SPLIT ? a.Kx : K;
  // k0 = 0 here; under split-K each tile's slice moves both by its k0 (set_act).
  const int8_t* xb0 = a.xq + (b_on ? (int64_t(bm) * LV + bl) * Kx + bg * 128 + 64 * (t & 1) : 0);
  const uint4* xbp = reinterpret_cast<const uint4*>(xb0);
  const int cs_b = b_on ? (G - bg + 1) >> 1 : 0;
  const int cm = LV == 2 ? t >> 1 : t;
  const bool c_on = cm < M;
  const float4* xd0 = reinterpret_cast<const float4*>(a.xds) + int64_t(c_on ? cm : 0) * (Kx >> 7);
  const float4* xd = xd0;
  const int cs_c = c_on ? (LV == 2 ? (G - (t & 1) + 1) >> 1 : (G + 1) >> 1) : 0;

  int ct = 0, cs = w;
  float yg[RB], yg8[RB];
#pragma unroll
  for (int b = 0; b < RB; ++b) yg[b] = yg8[b] = 0.f;
  // The batch of tiles [j0, j0 + n): sum over the warps in order, write y.
  auto reduce_batch = [&](int j0, int n, int buf) {
    for (int e = threadIdx.x; e < n * kTok * TR; e += blockDim.x) {
      const int j = e / (kTok * TR), m = (e / TR) % kTok, rr = e % TR;
      if (m >= M) continue;
      int o;
      int64_t rt;
      locate(int64_t(tb0) + j0 + j, o, rt);
      const Mv6Out& O = a.o[o];
      const int64_t r = rt * TR + rr;
      if (r >= O.N) continue;
      float v = 0.f;
      for (int ww = 0; ww < NW; ++ww) v += red[buf][j][ww][m][rr];
      O.y[m * O.N + r] = v;
    }
  };

  // B and the activation units of step cs; with one step per tile (ns == 1: S == NW, e.g. K = 5120) the warp's
  // step is the same in every tile, so they are loaded once, not per step.
  uint4 X[4];
  float4 xv0, xv1;
  auto load_b = [&](int c) {
    if (c < cs_b) {
      const uint4* xp = xbp + 16 * c;
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = xp[i];
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = make_uint4(0, 0, 0, 0);
    }
    xv0 = xv1 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < cs_c) {
      xv0 = xd[LV == 2 ? 2 * c + (t & 1) : 2 * c];
      if (LV == 1 && 2 * c + 1 < G) xv1 = xd[2 * c + 1];
    }
  };
  const bool hoist = ns == 1;
  // Split-K: the activations of tile ct's slice (its output's k0); B reloaded when the slice changes.
  int cur_o = -1;
  auto set_act = [&]() {
    if (!SPLIT || ct >= nt) return;
    int o;
    int64_t rt;
    locate(int64_t(tb0) + ct, o, rt);
    if (o == cur_o) return;
    cur_o = o;
    const int64_t k0 = a.o[o].k0;
    xbp = reinterpret_cast<const uint4*>(xb0 + (b_on ? k0 : 0));
    xd = xd0 + (k0 >> 7);
    if (hoist) load_b(w);
  };
  set_act();
  if (hoist && !SPLIT) load_b(w);
  for (int base = 0; base < total; base += D) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (base + s < total) {
        const Mv6Stage<RB>& st = ring[s];
        if (!hoist) load_b(cs);
        mv6_step<LV, RB>(st, X, xv0, xv1, yg, yg8);
        issue(ring[s]);
        cs += NW;
        if (cs >= S) {  // this warp's part of tile ct is done
          if constexpr (LV == 2) {
#pragma unroll
            for (int b = 0; b < RB; ++b) {
              yg[b] += __shfl_xor_sync(0xffffffffu, yg[b], 1);
              yg8[b] += __shfl_xor_sync(0xffffffffu, yg8[b], 1);
            }
          }
          const int batch = ct / TB, buf = batch & 1, j = ct - batch * TB;
          if (c_on && (LV == 1 || (t & 1) == 0)) {
#pragma unroll
            for (int b = 0; b < RB; ++b) {
              red[buf][j][w][cm][16 * b + g] = yg[b];
              red[buf][j][w][cm][16 * b + g + 8] = yg8[b];
            }
          }
#pragma unroll
          for (int b = 0; b < RB; ++b) yg[b] = yg8[b] = 0.f;
          if (j == TB - 1 || ct + 1 == nt) {  // the batch is complete in every warp (all warps end every tile)
            __syncthreads();
            reduce_batch(batch * TB, j + 1, buf);
          }
          cs = w;
          ++ct;
          set_act();
        }
      }
    }
  }

  // Split-K: this block's partials are written; count its arrival at each of its row tiles. The block that
  // brings a row tile's count to `split` sums the slices in slice order (deterministic: the order never
  // depends on who arrives last) and resets the counter for the next launch.
  if constexpr (SPLIT) {
    __shared__ unsigned last_mask;
    __threadfence();  // the partials are visible device-wide before the arrival that publishes them
    __syncthreads();
    const Mv6Out& O0 = a.o[0];
    for (int j0 = 0; j0 < nt; j0 += 32) {
      if (w == 0) {
        bool last = false;
        if (j0 + lane < nt) {
          int o;
          int64_t rt;
          locate(int64_t(tb0) + j0 + lane, o, rt);
          int32_t* c = a.count + rt;
          last = atomicAdd(c, 1) == a.split - 1;
          if (last) atomicExch(c, 0);
        }
        const unsigned mk = __ballot_sync(0xffffffffu, last);
        if (lane == 0) last_mask = mk;
      }
      __syncthreads();
      const unsigned mk = last_mask;
      if (mk) {
        __threadfence();
        for (int jb = 0; jb < 32; ++jb) {
          if (!((mk >> jb) & 1u)) continue;
          int o;
          int64_t rt;
          locate(int64_t(tb0) + j0 + jb, o, rt);
          const int64_t r0 = rt * TR;
          for (int e = threadIdx.x; e < int(M) * TR; e += blockDim.x) {
            const int m = e / TR;
            const int64_t r = r0 + e % TR;
            if (r >= O0.N) continue;
            float v = 0.f;
            for (int z = 0; z < a.split; ++z) v += __ldcg(a.o[z].y + m * O0.N + r);  // other SMs wrote them: L2
            a.ysum[m * O0.N + r] = v;
          }
        }
      }
      __syncthreads();  // last_mask is rewritten by the next chunk
    }
  }
}

// ---- v7 (round 10): the weights through the bulk-copy engine (TMA) into a shared-memory ring ----------------------
// Why: v6 keeps its loads in flight in a register ring (D x RB x 1 KB per warp: 80 KB per SM for gate+up, 51 KB for
// ffn_down) and the SMs streamed at 11-18 GB/s each, where the probe (4.5 TB/s) needs ~34 GB/s per SM. Here one
// producer warp streams STAGES of up to TR = 16 RB consecutive rows x the full K (ONE contiguous run of canonical
// words: one bulk copy, plus one of the scales) into ST stages of up to ~200 KB of shared memory, so the bytes in
// flight cost no registers and no address arithmetic in the consumers.
// Balance: a block owns a contiguous range of 8-ROW UNITS (not of tiles), and a stage takes up to 2 RB units of one
// output: ffn_down's 5,120 rows are 640 units over 132 SMs (4-5 each, <= 3 % over the mean), where 16-row tiles gave
// 2-3 (24 % over). A stage of 8 rows computes rows g + 8 from stale bytes; they are never written.
// Consumers: NW <= 20 warps walk every stage in lockstep (warp w takes steps w, w + NW, ... as in matvec6l_kernel:
// the same mma step, fragments now read from shared memory), put their partial rows in red[] and arrive on the
// stage's `empty` barrier; no block barrier in the loop. The producer, after waiting on `empty` (it has to before
// refilling the stage anyway), sums the stage's partials in warp order and writes y: deterministic (fixed step and
// warp order), and the sum off the consumers' path. B: one step per warp (S == NW, e.g. K = 5120) reads its
// activation words once, from global memory; otherwise the activations are copied once into shared memory (a warp
// reads the same steps of every stage; from L1 the first stage's reads were L2 misses in a dependent chain).
constexpr int kV7MaxWarps = 20;  // consumer warps; one more warp issues the copies and sums the stages
constexpr int kV7MaxStages = 8;
constexpr int kV7StageLoads = 4;  // the activation staging's loads in flight per lane (round 25)

// Round 24's timeline (Mv7Args::trace; matvec7_set_trace; block_trace.cuh): %globaltimer (ns) at a block's events,
// slot numbers in kernels.h; compiled in only with -DBONSAI_V7_TRACE.
#define V7_TRACE_VALUE(slot, v) BLOCK_TRACE_VALUE(a.trace, slot, v)
#define V7_TRACE(slot) BLOCK_TRACE(a.trace, slot)

struct Mv7Args {
  Mv6Out o[kMaxOuts];          // t0: first 8-row unit of the output; k0 unused
  const int8_t* xq;            // int8 [M, LV, K] transposed digit planes
  const float2* xds;           // [M, K/64] {unit, digit sum}
  uint64_t* trace;             // round 24, diagnostic: u64 [blocks, kV7TraceSlots] event times (kernels.h), or null
  int64_t K, M, units;         // units: 8-row units of all outputs
  int32_t n_outs, stages;      // stages: ST, the ring depth
  int32_t stage_bytes, words_bytes;  // one stage: words u32 [TR, K/16] then scales fp16 [TR, K/128]
  int32_t xs_bytes;            // activations staged in shared memory (0: read from global memory)
  int32_t site_early;          // fused site: stages the producer issues before the prologue is done (the rest after);
                               // plain (round 37): stages it issues before its pdl_wait (>= stages: the whole ring)
  int32_t first_rows;          // rows of a block's FIRST stage (round 15): -1 = its ragged remainder (units mod TR / 8)
                               // first instead of last, 0 = TR (the remainder last), N = N rows
  SitePrologue site;           // active (M = 1): the consumers compute the activations into the staging area
};


// SITE: the instance with the fused site (a.site.active; its prologue's registers stay out of the plain instance).
// K32: the step on m16n8k32 (mv7_step32, round 15; plain instances only), the staged activations in pair order.
template <int LV, int RB, bool SITE, bool K32 = false>
__global__ __launch_bounds__((kV7MaxWarps + 1) * 32, 1) void matvec7_kernel(const Mv7Args a) {
  static_assert(!(SITE && K32), "the fused site writes the staging area in the k16 order");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kTok = LV == 2 ? 2 : 4;
  constexpr int TR = 16 * RB;
  const int NW = int(blockDim.x >> 5) - 1;  // consumer warps; warp NW is the producer
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int K = int(a.K), G = K >> 7, S = (G + 1) >> 1;
  const int ST = a.stages;
  const int64_t nblk = gridDim.x;
  const int ub0 = int(a.units * blockIdx.x / nblk), ub1 = int(a.units * (blockIdx.x + 1) / nblk);
  // The block's stages: from unit u, up to 2 RB units of u's output (o: the output, r0: its first row, nrow: rows).
  // A block's first stage may be shorter (Mv7Args::first_rows): the consumers start on it after fewer bytes, and compute
  // it as a whole stage (its missing rows from stale bytes, never written). By default (-1) that is the block's ragged
  // remainder of units, which otherwise ends it: no extra stage, and the first bytes land sooner (round 15, call 7:
  // a fixed 8-row first stage made gate+up 17.29 -> 16.65 us and ffn_down 14.34 -> 14.10, but qkv+z 10.15 -> 10.87 and
  // gdn_out 6.87 -> 7.13, where it added a stage).
  const int rem = (ub1 - ub0) % (TR / 8);
  const int first_tr = a.first_rows < 0 ? (rem ? 8 * rem : TR) : a.first_rows > 0 && a.first_rows < TR ? a.first_rows : TR;
  auto stage_at = [&](int u, int& o, int64_t& r0, int& nrow) {
    o = 0;
#pragma unroll
    for (int i = 1; i < kMaxOuts; ++i)
      if (i < a.n_outs && u >= a.o[i].t0) o = i;
    r0 = int64_t(u - a.o[o].t0) * 8;
    nrow = int(min(min(int64_t(u == ub0 ? first_tr : TR), a.o[o].N - r0), int64_t(ub1 - u) * 8));
    return u + (nrow + 7) / 8;  // the next stage's unit
  };
  int nt = 0;  // stages of this block
  for (int u = ub0; u < ub1; ++nt) {
    int o, nrow;
    int64_t r0;
    u = stage_at(u, o, r0, nrow);
  }
  // Shared memory: ring [ST][stage_bytes] | full [ST], empty [ST] (mbarriers) | red float [ST + 1][NW][kTok][TR]
  // (partials of stage j in slot j % (ST + 1): the producer sums stage j before it issues stage j + ST + 1's copy,
  // and no consumer writes that slot again before that copy has landed) | xs int8 [M, LV, K] (xs_bytes, 16-aligned)
  // then xds float2 [M, K/64] when the activations are staged | SITE: the prologue's scratch float [NW / 4][128][8]
  // (the xready barrier sits after empty[], 16 bytes).
  unsigned char* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(ST) * a.stage_bytes);
  uint64_t* empty = full + ST;
  uint64_t* xready = empty + ST;  // SITE: the consumers' prologue is done (16 bytes reserved: red stays 16-aligned)
  float* red = reinterpret_cast<float*>(empty + ST + (SITE ? 2 : 0));
  unsigned char* xs = reinterpret_cast<unsigned char*>(red + size_t(ST + 1) * NW * kTok * TR);
  if (threadIdx.x == 0) {
    V7_TRACE(kV7TrStart);
    V7_TRACE_VALUE(kV7TrStages, uint64_t(nt));
    for (int s = 0; s < ST; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], unsigned(NW));
    }
    if constexpr (SITE) mbar_init(xready, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_trigger();

  if (w == NW) {  // ---- producer: copies ST stages ahead; sums each stage once it is consumed ----
    bool waited = false;
    int u_issue = ub0, u_sum = ub0;
    // The fused AddNorm site's h += delta (warp_site.cuh), once every copy is in flight.
    const bool resid = SITE && a.site.resid;
    auto write_resid = [&] {
      if (!waited) {
        pdl_wait();
        waited = true;
      }
      site_prologue_resid(a.site, K, lane);
    };
    if (resid && nt == 0) write_resid();
    bool ready = !SITE;
    // Ring positions as running counters (a division by the runtime ST per stage cost ~25 instructions each):
    // s = i % ST (the stage issued), es / eph = (i - ST) % ST and its phase parity, slot = (i - ST) % (ST + 1).
    int s = 0, es = 0, slot = 0;
    unsigned eph = 0;
    for (int i = 0; i < nt + ST; ++i) {
      if (i >= ST) {  // stage i - ST consumed
        mbar_wait(&empty[es], eph);
        if (lane == 0 && i - ST < kV7TrMaxStages) V7_TRACE(kV7TrEmpty0 + i - ST);
      }
      if (i < nt) {
        // Round 37 (plain instances): the rest of the copies after the wait, so that a ring's worth of copies does not
        // hold up the completion of the kernel before this one (its last stores queue behind them).
        if (!SITE && !waited && i == a.site_early && i < ST) {
          pdl_wait();
          waited = true;
          if (lane == 0) V7_TRACE(kV7TrProducerWaited);
        }
        if (!ready && i >= a.site_early) {  // the rest of the copies once the prologue's loads are done
          mbar_wait(xready, 0);
          ready = true;
        }
        int o, nrow;
        int64_t r0;
        u_issue = stage_at(u_issue, o, r0, nrow);
        const Mv6Out& O = a.o[o];
        unsigned char* st = ring + size_t(s) * a.stage_bytes;
        const unsigned wbytes = unsigned(nrow) * unsigned(K >> 2), sbytes = unsigned(nrow) * unsigned(K >> 6);
        const bool sbulk = sbytes % 16 == 0;  // false only on a ragged last stage
        if (!sbulk) {  // its scales by the warp (a bulk copy needs 16-byte multiples)
          auto* dst = reinterpret_cast<uint16_t*>(st + a.words_bytes);
          const uint16_t* src = O.scales + r0 * G;
          for (int e = lane; e < nrow * G; e += 32) dst[e] = __ldg(src + e);
          __syncwarp();  // the warp's stores before lane 0's arrive (a release) publishes them with the stage
        }
        if (lane == 0) {
          // generic-proxy accesses of this stage (a warp copy above, the consumers' reads) before the async copy
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          mbar_expect_tx(&full[s], wbytes + (sbulk ? sbytes : 0u));
          bulk_load(st, O.words + r0 * (K >> 4), wbytes, &full[s]);
          if (sbulk) bulk_load(st + a.words_bytes, O.scales + r0 * G, sbytes, &full[s]);
        }
        __syncwarp();
        if (lane == 0 && i == 0) V7_TRACE(kV7TrIssued);
        if (resid && i == nt - 1) write_resid();
        if (++s == ST) s = 0;
      }
      if (i >= ST) {
        if (!waited) {
          pdl_wait();  // y (written below) may still be read by earlier kernels; the weights above do not wait
          waited = true;
          if (lane == 0) V7_TRACE(kV7TrProducerWaited);
        }
        int o, nrow;
        int64_t r0;
        u_sum = stage_at(u_sum, o, r0, nrow);
        const Mv6Out& O = a.o[o];
#pragma unroll
        for (int e0 = 0; e0 < kTok * TR; e0 += 32) {
          const int e = e0 + lane, m = e / TR, rr = e % TR;
          if (m >= a.M || rr >= nrow) continue;
          const float* p = red + (size_t(slot) * NW * kTok + m) * TR + rr;  // + ww kTok TR for warp ww
          // Unrolled to the largest NW so the loads issue back to back (this sum is on the producer's path between
          // two copies); the adds stay in warp order.
          float pv[kV7MaxWarps];
#pragma unroll
          for (int ww = 0; ww < kV7MaxWarps; ++ww) pv[ww] = ww < NW ? p[ww * kTok * TR] : 0.f;
          float v = 0.f;
#pragma unroll
          for (int ww = 0; ww < kV7MaxWarps; ++ww)
            if (ww < NW) v += pv[ww];
          O.y[m * O.N + r0 + rr] = v;
        }
        // Round 29 (compute-sanitizer racecheck): every lane's reads of this red slot before lane 0's next
        // expect_tx arrive, which (through the copy it issues) lets the consumers rewrite the slot ST + 1 stages on.
        // Without it only lane 0's own reads were ordered before that arrive: a WAR hazard for lanes 1-31.
        __syncwarp();
        if (++es == ST) es = 0, eph ^= 1u;
        if (++slot == ST + 1) slot = 0;
      }
    }
    if (!waited) pdl_wait();
    if (lane == 0) V7_TRACE(kV7TrDone);
    return;
  }

  // ---- consumers ----
  pdl_wait();  // the activations depend on earlier kernels
  if (threadIdx.x == 0) V7_TRACE(kV7TrConsumerWaited);
  const int g = lane >> 2, t = lane & 3;
  const int64_t M = a.M;
  const int8_t* xq = a.xq;
  const float2* xds = a.xds;
  if constexpr (SITE) {  // the site of this product's input, computed here into the staging area (warp_site.cuh)
    auto* xs_q = reinterpret_cast<int8_t*>(xs);
    auto* xs_d = reinterpret_cast<float2*>(xs + a.xs_bytes);
    auto* scratch = reinterpret_cast<float*>(xs + a.xs_bytes + (K >> 6) * 8);  // float [NW / 4][128][8]
    site_prologue<LV>(a.site, K, NW, w, lane, xs_q, xs_d, red, scratch);  // red: free until the first stage's partials
    if (threadIdx.x == 0) {
      if (a.site.resid) {  // this block has read h: count it in (the producers wait for all)
        __threadfence();
        atomicAdd(a.site.count, 1);
      }
      mbar_arrive(xready);
    }
    xq = xs_q;
    xds = xs_d;
  }
  if (!SITE && a.xs_bytes > 0) {  // stage the activations: one L2 pass per block instead of one per warp step
    const int nq = int(M) * LV * K / 16, nd = int(M) * (K >> 6) / 2;  // uint4 of xq, float4 of xds
    if constexpr (K32) {
      // Each 64-byte block (4 uint4 X0..X3, on 4 consecutive lanes) in pair order (mv7_pair_order): lane r of the
      // four ends up with XP[r]. Even lanes keep {x, y} and take the odd neighbour's {x, y}; odd lanes keep {z, w} and
      // take the even one's {z, w}: two shuffles, the copy stays coalesced. nq is a multiple of 4 and the loop's
      // stride of 32, so a warp's lanes are all in or all out.
      // Round 25: kV7StageLoads loads in flight per lane before the first store (with one load a trip, each trip
      // waited for its own L2 round trip: ffn_down's 4 trips held 29 % of its stall samples under ncu).
      const bool odd = lane & 1;
      for (int e0 = threadIdx.x & ~31; e0 < nq; e0 += kV7StageLoads * NW * 32) {
        uint4 v[kV7StageLoads];
#pragma unroll
        for (int u = 0; u < kV7StageLoads; ++u) {
          const int e = e0 + u * NW * 32 + lane;
          v[u] = e < nq ? reinterpret_cast<const uint4*>(xq)[e] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kV7StageLoads; ++u) {
          const int e = e0 + u * NW * 32 + lane;
          const uint32_t r0 = __shfl_xor_sync(0xffffffffu, odd ? v[u].x : v[u].z, 1);
          const uint32_t r1 = __shfl_xor_sync(0xffffffffu, odd ? v[u].y : v[u].w, 1);
          if (e < nq)
            reinterpret_cast<uint4*>(xs)[e] = odd ? make_uint4(r0, v[u].z, r1, v[u].w) : make_uint4(v[u].x, r0, v[u].y, r1);
        }
      }
    } else {
      for (int e0 = threadIdx.x; e0 < nq; e0 += kV7StageLoads * NW * 32) {
        uint4 v[kV7StageLoads];
#pragma unroll
        for (int u = 0; u < kV7StageLoads; ++u)
          if (e0 + u * NW * 32 < nq) v[u] = reinterpret_cast<const uint4*>(xq)[e0 + u * NW * 32];
#pragma unroll
        for (int u = 0; u < kV7StageLoads; ++u)
          if (e0 + u * NW * 32 < nq) reinterpret_cast<uint4*>(xs)[e0 + u * NW * 32] = v[u];
      }
    }
    float4* xds_s = reinterpret_cast<float4*>(xs + a.xs_bytes);
    for (int e = threadIdx.x; e < nd; e += NW * 32) xds_s[e] = reinterpret_cast<const float4*>(xds)[e];
    asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");  // the consumers only (the producer never waits here)
    xq = reinterpret_cast<const int8_t*>(xs);
    xds = reinterpret_cast<const float2*>(xds_s);
  }
  // B role (column n = g) and accumulator role (columns 2t, 2t + 1), as in matvec6_kernel.
  const int bm = LV == 2 ? g >> 2 : g >> 1, bl = LV == 2 ? g & 1 : 0, bg = LV == 2 ? (g >> 1) & 1 : g & 1;
  const bool b_on = bg == (t >> 1) && bm < M;
  const int64_t xb_off = b_on ? (int64_t(bm) * LV + bl) * K + bg * 128 + 64 * (t & 1) : 0;  // bytes into xq
  const uint4* xbp = reinterpret_cast<const uint4*>(xq + xb_off);
  const int cs_b = b_on ? (G - bg + 1) >> 1 : 0;
  const int cm = LV == 2 ? t >> 1 : t;
  const bool c_on = cm < M;
  const int64_t xd_off = int64_t(c_on ? cm : 0) * (K >> 7);  // float4 into xds
  const float4* xd = reinterpret_cast<const float4*>(xds) + xd_off;
  // Round 25: the same B through pointers derived from the shared-memory base, for the loop's per-step loads (more than
  // one step per warp: always staged, SITE or not), so they are LDS, not the generic LD that xq / xds (global memory
  // or shared) get.
  const uint4* xbp_s = reinterpret_cast<const uint4*>(xs + xb_off);
  const float4* xd_s = reinterpret_cast<const float4*>(xs + a.xs_bytes) + xd_off;
  const int cs_c = c_on ? (LV == 2 ? (G - (t & 1) + 1) >> 1 : (G + 1) >> 1) : 0;
  const int lim_s = LV == 2 ? (G - (t & 1) + 1) >> 1 : S, lim_s2 = G >> 1;  // the lane's scale groups exist
  uint4 X[4];
  float4 xv0, xv1;
  auto load_b = [&](int c, const uint4* xb, const float4* xdp) {
    if (c < cs_b) {
      const uint4* xp = xb + 16 * c;
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = xp[i];
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = make_uint4(0, 0, 0, 0);
    }
    xv0 = xv1 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < cs_c) {
      xv0 = xdp[LV == 2 ? 2 * c + (t & 1) : 2 * c];
      if (LV == 1 && 2 * c + 1 < G) xv1 = xdp[2 * c + 1];
    }
  };
  const bool hoist = S == NW;  // one step per warp and stage: its B is the same in every stage
  if (hoist) {
    load_b(w, xbp, xd);
    if constexpr (K32) {  // read from global memory in the k16 order: into pair order once
      uint4 XP[4];
      mv7_pair_order(X, XP);
#pragma unroll
      for (int i = 0; i < 4; ++i) X[i] = XP[i];
    }
  }
  const int rs = K >> 2;  // bytes per row of words in a stage
  const bool holder = c_on && (LV == 1 || (t & 1) == 0);
  // j % ST and j % (ST + 1) as running counters: a division by the runtime ST per stage cost ~25 instructions each
  // (round 14: -12 % per launch on gate+up). (Also tried there: the one-step case as its own instance with the lane's
  // offsets in a stage hoisted, 237 instead of 280 instructions per stage in the SASS: not faster, head +10 %.)
  int s = 0, slot = 0;
  unsigned ph = 0;  // (j / ST) & 1
  if (threadIdx.x == 0) V7_TRACE(kV7TrStaged);
  for (int j = 0; j < nt; ++j) {
    mbar_wait(&full[s], ph);
    if (threadIdx.x == 0 && j < kV7TrMaxStages) V7_TRACE(kV7TrFull0 + j);
    const unsigned char* wrow = ring + size_t(s) * a.stage_bytes + g * rs + 16 * t;  // row g, step 0
    const uint16_t* srow = reinterpret_cast<const uint16_t*>(ring + size_t(s) * a.stage_bytes + a.words_bytes) + g * G +
                           (LV == 2 ? (t & 1) : 0);  // row g: the lane's (first) accumulator group of step 0
    float yg[RB], yg8[RB];
#pragma unroll
    for (int b = 0; b < RB; ++b) yg[b] = yg8[b] = 0.f;
    for (int c = w; c < S; c += NW) {
      if (!hoist) load_b(c, xbp_s, xd_s);
      Mv6Stage<RB> sv;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        // Past the last group (odd G, lanes t >= 2 of the last step) these read the next row's bytes: their B is zero.
        sv.wa[b] = *reinterpret_cast<const uint4*>(wrow + 16 * b * rs + 64 * c);
        sv.wb[b] = *reinterpret_cast<const uint4*>(wrow + (16 * b + 8) * rs + 64 * c);
        const uint16_t* q = srow + 16 * b * G + 2 * c;
        sv.sc[b] = c < lim_s ? uint32_t(q[0]) | uint32_t(q[8 * G]) << 16 : 0u;
        if constexpr (LV == 1) sv.sc2[b] = c < lim_s2 ? uint32_t(q[1]) | uint32_t(q[8 * G + 1]) << 16 : 0u;
      }
      if constexpr (K32) mv7_step32<LV, RB>(sv, X, xv0, xv1, yg, yg8);  // X in pair order (staged or converted)
      else mv6_step<LV, RB>(sv, X, xv0, xv1, yg, yg8);
    }
    if constexpr (LV == 2) {  // lanes t, t ^ 1 hold the two groups of one token
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        yg[b] += __shfl_xor_sync(0xffffffffu, yg[b], 1);
        yg8[b] += __shfl_xor_sync(0xffffffffu, yg8[b], 1);
      }
    }
    if (holder) {
      float* p = red + ((size_t(slot) * NW + w) * kTok + cm) * TR + g;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        p[16 * b] = yg[b];
        p[16 * b + 8] = yg8[b];
      }
    }
    __syncwarp();  // every lane's reads of the stage and writes of red before lane 0's arrive (a release)
    if (lane == 0) mbar_arrive(&empty[s]);
    if (++s == ST) s = 0, ph ^= 1u;
    if (++slot == ST + 1) slot = 0;
  }
}

// Block shapes (Options::matvec6_cfg 1-4): row blocks per tile, steps in flight, warps per block; one block
// per SM. cfg 0 (default) picks 2 row blocks when that leaves >= 4 tiles per block, else 1 (balance: ffn_down's
// 5,120 rows are 320 tiles of 16 = 2-3 per SM, but 160 of 32 = 1-2).
struct Mv6Cfg {
  int rb, d, nw;
};
constexpr Mv6Cfg kMv6Cfgs[] = {{1, 3, 24}, {1, 4, 16}, {2, 2, 16}, {2, 3, 16}};
template <int LV>
const void* matvec6_kernel_for(int shape) {
  switch (shape) {
    case 1: return reinterpret_cast<const void*>(&matvec6_kernel<LV, 1, 4, 16>);
    case 2: return reinterpret_cast<const void*>(&matvec6_kernel<LV, 2, 2, 16>);
    case 3: return reinterpret_cast<const void*>(&matvec6_kernel<LV, 2, 3, 16>);
    default: return reinterpret_cast<const void*>(&matvec6_kernel<LV, 1, 3, 24>);
  }
}

}  // namespace

bool matvec6_supported(int64_t M, int levels, int64_t K) {
  return M >= 1 && M <= (levels == 2 ? 2 : 4) && K % 128 == 0 && K <= (int64_t(1) << 20);
}

namespace {
// The lockstep shape cfg 0 resolves to: 32-row tiles (6), or 16-row ones (7) where 32-row tiles leave blocks with
// 1 or 2 tiles (few rows, or K = 17,408: ffn_down) - measured per shape, docs/cuda-kernels.md round 8.
int mv6_resolve_cfg(int64_t rows, int64_t K, int cfg) { return cfg == 0 ? (rows <= 2048 || K > 8192 ? 7 : 6) : cfg; }
// Warps of the lockstep kernel for a tile of `steps` steps: NW <= min(steps, 20) with the fewest idle step slots
// per tile (20 -> 20, 24 -> 12, 68 -> 17).
int mv6_lockstep_warps(int64_t steps) {
  int nw = int(std::min<int64_t>(steps, kLsMaxWarps));
  double best = -1;
  for (int n = nw; n >= std::min(nw, 12); --n) {
    const double eff = double(steps) / double(n * ((steps + n - 1) / n));
    if (eff > best + 1e-9) best = eff, nw = n;
  }
  return nw;
}
// Matvec v7 (cfg 8 = the stage rows by shape, 9 = 16-row stages, 10 = 32-row stages): the smem ring as deep as fits in
// kV7Smem (<= kV7MaxStages stages) beside the partials and, unless one step per warp, the staged activations.
constexpr int kV7Smem = 200 * 1024;  // leaves >= 28 KB of L1 for the activations read from global memory
// The SITE instances read no activation from global memory in their loop: the most an sm_90 block may take.
constexpr int kV7SmemSite = 227 * 1024 - 1024;  // (the kernel's 1 KB of static shared memory)
template <int LV, int RB, bool SITE = false, bool K32 = false>
const void* mv7_kernel() {
  static const void* const f = [] {
    const void* k = reinterpret_cast<const void*>(&matvec7_kernel<LV, RB, SITE, K32>);
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SITE ? kV7SmemSite : kV7Smem) != cudaSuccess)
      (void)cudaGetLastError();  // no device here (host-only tests): the launch itself would report it
    return k;
  }();
  return f;
}
struct Mv7Shape {
  int stages = 0, nw = 0;
  int64_t smem = 0, stage_bytes = 0, words_bytes = 0, xs_bytes = 0;
};
// stage_x: the activations always staged (the fused site writes them there).
Mv7Shape mv7_shape(int64_t K, int64_t M, int lv, int rb, bool stage_x = false) {  // stage_x: SITE's layout
  Mv7Shape s;
  const int64_t tr = 16 * rb, tok = lv == 2 ? 2 : 4, steps = (K / 128 + 1) / 2;
  s.words_bytes = tr * K / 4;
  s.stage_bytes = s.words_bytes + tr * K / 64;
  s.nw = mv6_lockstep_warps(steps);
  s.xs_bytes = s.nw == steps && !stage_x ? 0 : (M * lv * K + 15) / 16 * 16;  // `hoist` reads global memory
  const int64_t xds_bytes = s.xs_bytes ? M * K / 8 : 0;
  const int64_t site_bytes = stage_x ? 16 + (s.nw / 4) * 128 * 8 * 4 : 0;  // the xready barrier, the prologue's scratch
  for (int st = kV7MaxStages; st >= 1; --st) {
    const int64_t bytes =
        st * s.stage_bytes + 16 * st + (st + 1) * s.nw * tok * tr * 4 + s.xs_bytes + xds_bytes + site_bytes;
    if (bytes <= (stage_x ? kV7SmemSite : kV7Smem)) {
      s.stages = st;
      s.smem = bytes;
      break;
    }
  }
  return s;
}
// The v7 launch (cfg 8-10; 11-13: the same on round 14's k16 step), or false where two stages do not fit (the caller
// falls back to v6). site: the fused site (M = 1, always the k16 step), or null.
bool mv7_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M, int lv,
                int sms, int cfg, const SitePrologue* site, Launch& out, int site_early = -1, int first_rows = -1) {
  // Auto: 32-row stages where they leave >= 3 per SM and >= 3 fit (fewer per-stage overheads), else 16. (The
  // kernel table of round 10 measured 32-row stages faster on every shape but attn_k; not yet the rule: its whole-
  // model run is still to do, docs/cuda-kernels.md.)
  int64_t units = 0;
  for (int i = 0; i < n_outs; ++i) units += (outs[i].N + 7) / 8;
  const bool sx = site != nullptr;
  const Mv7Shape s2 = mv7_shape(K, M, lv, 2, sx), s1 = mv7_shape(K, M, lv, 1, sx);
  // The step: cfg 8-10 k32, 11-13 the same stage shapes on the k16 step (round 14's; always the fused site's), 14 =
  // cfg 8 with k32 except on 16-row stages over K > 8,192 (ffn_down: 4 steps a warp and stage, ONE Horner chain a
  // step; k32 measured 14.0-14.4 vs 13.8 us there in round 15's calls 1-2, and faster everywhere else).
  const int step_cfg = cfg;
  if (cfg == 14) cfg = 8;
  if (cfg > 10) cfg -= 3;
  const int rb = cfg == 10 ? (s2.stages >= 2 ? 2 : 1)
                 : cfg == 9 ? 1
                            : (units >= 12 * int64_t(sms) && s2.stages >= 3 ? 2 : 1);
  const bool k32 = !site && (step_cfg <= 10 || (step_cfg == 14 && (rb == 2 || K <= 8192)));
  const Mv7Shape sh = rb == 2 ? s2 : s1;
  if (sh.stages < 2) return false;
  Mv7Args b{};
  int64_t u0 = 0;
  for (int i = 0; i < n_outs; ++i) {
    b.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, u0, 0};
    u0 += (outs[i].N + 7) / 8;
  }
  b.xq = xq;
  b.xds = xds;
  b.K = K;
  b.M = M;
  b.units = u0;
  b.n_outs = n_outs;
  b.stages = sh.stages;
  b.stage_bytes = int32_t(sh.stage_bytes);
  b.words_bytes = int32_t(sh.words_bytes);
  b.xs_bytes = int32_t(sh.xs_bytes);
  if (site) b.site = *site;
  b.site_early = site_early < 0 ? sh.stages : site_early;
  b.first_rows = site ? 0 : first_rows;
  const void* f = site ? (lv == 2 ? (rb == 2 ? mv7_kernel<2, 2, true>() : mv7_kernel<2, 1, true>())
                                  : (rb == 2 ? mv7_kernel<1, 2, true>() : mv7_kernel<1, 1, true>()))
                  : k32 ? (lv == 2 ? (rb == 2 ? mv7_kernel<2, 2, false, true>() : mv7_kernel<2, 1, false, true>())
                                 : (rb == 2 ? mv7_kernel<1, 2, false, true>() : mv7_kernel<1, 1, false, true>()))
                        : (lv == 2 ? (rb == 2 ? mv7_kernel<2, 2>() : mv7_kernel<2, 1>())
                                   : (rb == 2 ? mv7_kernel<1, 2>() : mv7_kernel<1, 1>()));
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(sms, b.units));
  out = make_launch(f, dim3(unsigned(blocks)), dim3(unsigned(32 * (sh.nw + 1))), uint32_t(sh.smem), b);
  return true;
}
}  // namespace

bool matvec7_site_supported(const SiteDesc& d) {
  const int64_t K = d.K, n = d.n;
  const bool aliased = d.pre_out && (d.pre_out == d.src || d.pre_out == d.resid || d.pre_out == d.src2);
  return d.rows == 1 && d.nparts == 1 && !d.inverse && !d.perm && d.ld == K && K % 1024 == 0 && K <= (int64_t(1) << 20) && n >= 1 &&
         n <= 1024 && (n & (n - 1)) == 0 && (d.levels == 1 || d.levels == 2) &&
         (d.pre == kPreNone || d.pre == kPreSiluMul || d.pre == kPreSigmoidMul ||
          (d.pre == kPreGatedNorm && d.gain && d.seg >= 8 && d.seg <= 256 && 256 % d.seg == 0) ||
          (d.pre == kPreAddNorm && d.gain && !aliased));
}

bool matvec7_site_launch(const TernaryDev* outs, int n_outs, int64_t K, const SiteDesc& d, int sms, int cfg,
                         int32_t* counters, Launch& out, int early, bool timing_only) {
  if (!matvec7_site_supported(d) || d.K != K || (d.pre == kPreAddNorm && d.resid && !counters)) return false;
  if (cfg == 0) cfg = 8;
  if (cfg < 8 || cfg > 10) return false;
  SitePrologue s = site_prologue_of(d);
  if (d.pre != kPreAddNorm) s.resid = s.pre_out = nullptr;  // only AddNorm's outputs are written (warp_site.cuh)
  s.count = s.resid ? counters : nullptr;
  if (timing_only) s.active = 2;
  return mv7_launch(outs, n_outs, K, nullptr, nullptr, 1, d.levels == 2 ? 2 : 1, sms, cfg, &s, out, early);
}

namespace {
// The v7 instances (a launch is v7 when its function is one of them).
bool is_matvec7(const Launch& l) {
  if (l.size != sizeof(Mv7Args)) return false;
  const void* const fs[] = {mv7_kernel<1, 1>(),
                            mv7_kernel<1, 2>(),
                            mv7_kernel<2, 1>(),
                            mv7_kernel<2, 2>(),
                            mv7_kernel<1, 1, true>(),
                            mv7_kernel<1, 2, true>(),
                            mv7_kernel<2, 1, true>(),
                            mv7_kernel<2, 2, true>(),
                            mv7_kernel<1, 1, false, true>(),
                            mv7_kernel<1, 2, false, true>(),
                            mv7_kernel<2, 1, false, true>(),
                            mv7_kernel<2, 2, false, true>()};
  return std::find(std::begin(fs), std::end(fs), l.func) != std::end(fs);
}
}  // namespace

bool matvec7_trace_compiled() { return kBlockTraceCompiled; }

bool matvec7_set_trace(Launch& l, uint64_t* trace) {
  if (!matvec7_trace_compiled() || !is_matvec7(l)) return false;
  set_arg_field(l, &Mv7Args::trace, trace);
  return true;
}

int matvec6_split_for(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int cfg, int req,
                      bool any) {
  if (req <= 0 || n_outs != 1 || !matvec6_supported(M, levels, K)) return 1;
  cfg = mv6_resolve_cfg(outs[0].N, K, cfg);
  if (cfg < 5 || cfg > 7) return 1;  // the contiguous shapes (1-4) do not split
  auto valid = [&](int s) { return s >= 1 && s <= kMaxOuts && K % (128 * s) == 0; };
  // ffn_down's shape (K > 8,192, M <= 2; at one token v3 runs otherwise) unless `any`.
  if (!any && (K <= 8192 || M > 2)) return 1;
  if (req >= 2) return valid(req) ? req : 1;
  // Auto: one token only. The S (<= 4) with the fewest serial steps per warp: the busiest block's tiles times each
  // warp's steps per tile; ties to the fewer slices.
  if (M != 1) return 1;
  const int64_t tr = cfg == 6 ? 32 : 16, tiles = (outs[0].N + tr - 1) / tr;
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= kMaxOuts; ++s) {
    if (!valid(s)) continue;
    const int64_t st = s * tiles, blocks = std::max<int64_t>(1, std::min<int64_t>(sms, st));
    const int64_t steps = (K / s / 128 + 1) / 2, nw = mv6_lockstep_warps(steps);
    const int64_t cost = (st + blocks - 1) / blocks * ((steps + nw - 1) / nw);
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

Launch matvec6_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                      int levels, int sms, int cfg, int split, float* part, int32_t* counters, bool interleave, int v7_first,
                      int v7_early) {
  Mv6Args a{};
  a.xq = xq;
  a.xds = xds;
  a.K = K;
  a.Kr = a.Kx = K;
  a.M = M;
  a.n_outs = n_outs;
  a.split = 1;
  int64_t rows = 0;
  for (int i = 0; i < n_outs; ++i) rows += outs[i].N;
  const int lv = levels == 2 ? 2 : 1;
  cfg = mv6_resolve_cfg(rows, K, cfg);
  if (cfg >= 8 && cfg <= 14 && split <= 1) {
    Launch l;
    if (mv7_launch(outs, n_outs, K, xq, xds, M, lv, sms, cfg, nullptr, l, v7_early, v7_first)) return l;
    cfg = mv6_resolve_cfg(rows, K, 0);  // a K too long for two stages: v6
  }
  if (split > 1) {
    if (n_outs != 1 || cfg < 5 || cfg > 7 || split > kMaxOuts || K % (128 * split) != 0 || !part || !counters)
      throw std::invalid_argument("matvec6_launch: split-K " + std::to_string(split) + " needs one output, a lockstep "
                                  "shape (cfg 0, 5-7), K (" + std::to_string(K) + ") a multiple of 128 x split <= " +
                                  std::to_string(kMaxOuts) + ", partials and counters");
    a.split = split;
    a.ilv = interleave ? 1 : 0;
    a.K = K / split;
    a.ysum = outs[0].y;
    a.count = counters;
  }
  if (cfg >= 5 && cfg <= 7) {  // lockstep: RB x D = 1 x 4, 2 x 2, 1 x 3
    const int rb = cfg == 6 ? 2 : 1;
    const int64_t tr = 16 * rb;
    int64_t t0 = 0;
    if (a.split > 1) {
      // One output per K slice z: the weights from column k0 = z K / split on (the row strides stay K's), the
      // partial y to part + z M N; the same row tiles in each (the arrival counters are per row tile). Tile order:
      // row tile major (interleave; t0 unused) or slice major.
      const TernaryDev& d = outs[0];
      const int64_t ks = a.K, tiles = (d.N + tr - 1) / tr;
      for (int z = 0; z < split; ++z) {
        a.o[z] = {d.words + z * ks / 16, d.scales + z * ks / 128, part + z * M * d.N, d.N, z * tiles, z * ks};
      }
      a.n_outs = split;
      a.tiles = split * tiles;
    } else {
      for (int i = 0; i < n_outs; ++i) {
        a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, t0, 0};
        t0 += (outs[i].N + tr - 1) / tr;
      }
      a.tiles = t0;
    }
    const int64_t S = (a.K / 128 + 1) / 2;
    const int nw = mv6_lockstep_warps(S);
    const void* f = lv == 2 ? (cfg == 5 ? reinterpret_cast<const void*>(&matvec6l_kernel<2, 1, 4>)
                               : cfg == 6 ? reinterpret_cast<const void*>(&matvec6l_kernel<2, 2, 2>)
                                          : reinterpret_cast<const void*>(&matvec6l_kernel<2, 1, 3>))
                            : (cfg == 5 ? reinterpret_cast<const void*>(&matvec6l_kernel<1, 1, 4>)
                               : cfg == 6 ? reinterpret_cast<const void*>(&matvec6l_kernel<1, 2, 2>)
                                          : reinterpret_cast<const void*>(&matvec6l_kernel<1, 1, 3>));
    if (a.split > 1)
      f = lv == 2 ? (cfg == 5 ? reinterpret_cast<const void*>(&matvec6l_kernel<2, 1, 4, true>)
                     : cfg == 6 ? reinterpret_cast<const void*>(&matvec6l_kernel<2, 2, 2, true>)
                                : reinterpret_cast<const void*>(&matvec6l_kernel<2, 1, 3, true>))
                  : (cfg == 5 ? reinterpret_cast<const void*>(&matvec6l_kernel<1, 1, 4, true>)
                     : cfg == 6 ? reinterpret_cast<const void*>(&matvec6l_kernel<1, 2, 2, true>)
                                : reinterpret_cast<const void*>(&matvec6l_kernel<1, 1, 3, true>));
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(sms, a.tiles));
    return make_launch(f, dim3(unsigned(blocks)), dim3(unsigned(32 * nw)), 0, a);
  }
  const int shape = cfg >= 1 && cfg <= 4 ? cfg - 1 : 2;
  const Mv6Cfg c = kMv6Cfgs[shape];
  const int64_t tr = 16 * c.rb;  // rows per tile
  int64_t t0 = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, t0, 0};
    t0 += (outs[i].N + tr - 1) / tr;
  }
  a.tiles = t0;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(sms, a.tiles));
  const void* f = lv == 2 ? matvec6_kernel_for<2>(shape) : matvec6_kernel_for<1>(shape);
  return make_launch(f, dim3(unsigned(blocks)), dim3(unsigned(32 * c.nw)), 0, a);
}

}  // namespace bonsai::cuda
