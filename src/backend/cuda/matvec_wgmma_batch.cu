// Batched-decode ternary product on wgmma ("mvw", round 10: M = 9..32 tokens): y [M, N] = the same numbers as
// the GEMMs (per 128-group an exact int32 dot, then f += d_w u_x (254 I0 + I1) in fp32), for the M of a batched
// decode step, where v3 (gemm3_kernel<32>, gemm_ws.cu) took 77 us on gate+up M32 against a ~11 us weight floor.
//
// Why v3 is slow there (docs/cuda-kernels.md round 10): its block is 128 rows, so each 8 KB activation group
// (32 tokens x 2 digit planes x 128 B) is re-read from L2 for every 4 KB of weights, and 272 such blocks (544 after
// its split-K) run in 5 rounds of 132; each consumer keeps one group in flight and the two consumers take turns.
// Here:
//   - a block is 4 warpgroups (512 threads), one per SM, and its UNIT of work is one 128-group of a ROW BLOCK of
//     256 rows (4 tiles of 64 rows, one per warpgroup): the group's activation tile is staged once for 256 rows.
//   - the units (row blocks x groups, row block major) are cut into one balanced contiguous range per block
//     ("stream-K"), so every SM does the same number of units whatever the shape (no rounds, no idle SMs). A row
//     block whose groups are cut between blocks is finished by the LAST block to reach it: each block writes its
//     partial outputs to a slot, bumps the row block's counter, and the one that sees the count complete adds the
//     slots in block order (deterministic; no float atomics) and resets the counter.
//   - ONE wgmma per k-step: B is all 2 M digit planes (xq [M, LV, K] read as [LV M, K]: N = 64 at M <= 32 q16),
//     so the accumulator lane holding plane 2m also holds 2m + 1 and 254 I0 + I1 is one IMAD in-lane.
//   - no producer warpgroup: each of the 512 threads issues 1-3 cp.async per unit (one 16 B of weights, one of the
//     activation, one unit), S units ahead, completing on the stage's `full` mbarrier (count 512, .noinc); a stage
//     is refilled once all 512 threads arrived on its `empty` mbarrier. The 4 warpgroups run free of each other
//     (no turn-taking): 16 warps per SM hide each other's wgmma / load latency.
//   - the weights go to wgmma from REGISTERS as in v3 (thread (warp w, g, q) decodes rows 16 w + g, + 8, k bytes
//     4q.. / 16 + 4q.. of each k-step = decode4(word >> 2q)), raw words in shared memory 32 B per row, the two 16 B
//     chunks of row r swapped when (r >> 2) & 1 so the 8 rows a warp reads at once hit 8 different bank quads.
//
// Measured (H200, docs/cuda-kernels.md round 10, us per launch, v3 in the same run): faster than v3 only on gate+up
// (M12 48.0 vs 72.4, M16 48.4 vs 73.6, M24 62.0 vs 75.0, M32 62.3 vs 77.4); slower on qkv+z M32 (33.8 vs 24.9),
// ffn_down M32 (37.7 vs 30.9), attn_o M32 (20.1 vs 13.9), head M32 (397 vs 371), and in the whole model (B = 32
// 1,840 vs 1,980 tok/s), so the backend leaves it off (Options::matvec_wgmma = 1). ncu (gate+up M32): ~2,900 SM cycles
// per unit against ~700 of issue: each warpgroup has one unit in flight and its chain (barrier, proxy fence, words,
// decode, 4 wgmmas, wait, scale loads, combine) is the unit time. A producer-warp variant (3 consumer warpgroups, no
// cp.async in the consumers' fences) measured slower still (gate+up M32 69.6 us).
#include <algorithm>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ternary_dot.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/cuda/mbarrier.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kMvwWgs = 4;              // warpgroups per block, one 64-row tile each
constexpr int kMvwRows = 64 * kMvwWgs;  // rows of a row block
constexpr int kMvwThreads = 128 * kMvwWgs;

struct MvwOut {
  const uint32_t* words;   // u32 [N, K/16] canonical
  const uint16_t* scales;  // fp16 [N, K/128]
  float* y;                // fp32 [M, N]
  int64_t N;
  int64_t t0;              // first 64-row tile of this output in the launch's tile space
};
struct MvwArgs {
  MvwOut o[kMaxOuts];
  const int8_t* xq;   // int8 [M, LV, K] transposed digit planes (ternary.cu header)
  const float2* xds;  // [M, K/64] {unit, digit sum} per 64-element chunk; the unit of chunk 2g is group g's
  float* part;        // fp32 [2 gridDim.x][NV][kMvwThreads] partial outputs of cut row blocks: slot 2b = block b's
                      // first row block, 2b + 1 its last
  int32_t* cnt;       // int32 [row blocks] arrivals at cut row blocks (zero before the launch, left zero)
  int64_t K, M;
  int64_t tiles;  // 64-row tiles of all outputs (each output padded to 64 rows)
  int64_t units;  // row blocks x groups
  int32_t n_outs, pad;
};

// Shared memory per stage (offsets from the 1024-aligned base): the activation tile first (swizzle atoms need
// 1024 B alignment), then the raw words, the units, the mbarriers.
template <int NP, int S>
struct MvwLayout {
  static constexpr int x_bytes = NP * 128;       // [NP / 8 atoms][8 planes][128 B], 128-byte swizzled, K-major
  static constexpr int w_bytes = kMvwRows * 32;  // [kMvwRows][2 x 16 B], chunk h of row r at 16 (h ^ ((r >> 2) & 1))
  static constexpr int u_bytes = 32 * 4;         // [32] float units of the token columns (order: see the kernel)
  static constexpr int w_off = S * x_bytes;
  static constexpr int u_off = w_off + S * w_bytes;
  static constexpr int bar_off = u_off + S * u_bytes;  // [2][S] u64: full, empty
  static constexpr int bytes = bar_off + 2 * S * 8;
  // Each stage's swizzle atoms on 1024 B, the words' and units' 16 B copies, the mbarriers' 8 B (round 35's lesson).
  static_assert(x_bytes % 1024 == 0 && w_off % 16 == 0 && u_off % 16 == 0 && bar_off % 8 == 0);
};


#ifdef BONSAI_WGMMA
// wgmma m64nNk32 s32 += s8 x s8, A (64 rows x 32 k) from registers, B (N planes x 32 k) from shared memory via the
// descriptor; N = 32 (16 accumulators) or 64 (32). acc = 0: D = A B.
__device__ __forceinline__ void mvw_wgmma(int (&d)[16], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
      "{%16,%17,%18,%19}, %20, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
        "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
__device__ __forceinline__ void mvw_wgmma(int (&d)[32], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,"
      "%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
        "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]),
        "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]),
        "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
#endif

// The block that owns unit u when U units are cut into nb ranges [b U / nb, (b + 1) U / nb).
__device__ __forceinline__ int64_t mvw_begin(int64_t b, int64_t U, int64_t nb) { return b * U / nb; }
__device__ __forceinline__ int64_t mvw_owner(int64_t u, int64_t U, int64_t nb) {
  int64_t b = u * nb / U;
  while (b + 1 < nb && mvw_begin(b + 1, U, nb) <= u) ++b;
  while (b > 0 && mvw_begin(b, U, nb) > u) --b;
  return b;
}

// LV digits per activation element (2: q16, 1: q8); NP planes in the B tile (32 or 64: LV M rounded up), S stages.
// Accumulator register 4j + i of thread (warp w, g, q) is row 16 w + g + 8 (i >> 1), plane 8j + 2q + (i & 1)
// (wgmma D layout), so under q16 it is token 4j + q, digit i & 1 (the pair is in-lane), under q8 token 8j + 2q + (i & 1).
template <int LV, int NP, int S>
__global__ __launch_bounds__(kMvwThreads, 1) void mvw_kernel(const MvwArgs a) {
  static_assert(NP == 32 || NP == 64);
  using Lay = MvwLayout<NP, S>;
  constexpr int R = NP / 2;         // int32 accumulators per thread (64 x NP / 128)
  constexpr int NV = NP / (2 * LV);  // float outputs per thread
  constexpr int TC = NP / LV;       // token columns of the tile
  extern __shared__ __align__(128) unsigned char mvw_smem[];
  unsigned char* base = mvw_smem + ((1024 - (smem_u32(mvw_smem) & 1023)) & 1023);  // the launch adds 1 KB
  const uint32_t x_s = smem_u32(base), w_s = x_s + Lay::w_off, u_s = x_s + Lay::u_off, bar_s = x_s + Lay::bar_off;
  const float* units = reinterpret_cast<const float*>(base + Lay::u_off);  // [S][32]
  auto full = [&](int s) { return bar_s + 8u * unsigned(s); };
  auto empty = [&](int s) { return bar_s + 8u * unsigned(S + s); };
  __shared__ int last_flag;

  const int tid = threadIdx.x;
  const int64_t K = a.K, M = a.M, G = K / 128, KW = K / 16, C = K / 64, U = a.units, nb = gridDim.x;
  const int64_t u0 = mvw_begin(blockIdx.x, U, nb), n = mvw_begin(int64_t(blockIdx.x) + 1, U, nb) - u0;
  const int64_t rb_first = u0 / G;
  auto out_of = [&](int64_t tile) {
    int o = 0;
#pragma unroll
    for (int i = 1; i < kMaxOuts; ++i)
      if (i < a.n_outs && tile >= a.o[i].t0) o = i;
    return o;
  };

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), kMvwThreads);   // every thread's .noinc arrival once its copies of the stage landed
      mbar_init(empty(s), kMvwThreads);  // every thread, once its reads (and wgmmas) of the stage are done
    }
  }
  __syncthreads();
  pdl_trigger();

  // ---- copies (every thread; cursors advance one unit per issue) ----
  // Weights: row wr = 8 (tid / 16) + tid % 8 of the row block, 16 B chunk wh = (tid / 8) & 1 (8 consecutive threads
  // fill 8 rows of one chunk column).
  const int wr = (tid >> 4) * 8 + (tid & 7), wh = (tid >> 3) & 1;
  const uint32_t wdst = w_s + uint32_t(wr * 32 + ((wh ^ ((wr >> 2) & 1)) << 4));
  int64_t wrb = rb_first, wg = u0 % G;  // weight cursor: row block, group
  const uint32_t* wsrc = a.o[0].words;
  int wbytes = 0;
  auto set_wrow = [&]() {
    const int64_t tile = wrb * kMvwWgs + (wr >> 6);
    const MvwOut& O = a.o[out_of(tile)];
    const int64_t lr = (tile - O.t0) * 64 + (wr & 63);
    const bool ok = tile < a.tiles && lr < O.N;
    wsrc = O.words + (ok ? lr : 0) * KW + wh * 4;
    wbytes = ok ? 16 : 0;  // rows past N: zeros (their outputs are never stored)
  };
  set_wrow();
  auto issue_w = [&](int s) {
    cp_async16_s(wdst + uint32_t(s * Lay::w_bytes), wsrc + wg * 8, wbytes);
    if (++wg == G) {
      wg = 0;
      ++wrb;
      if (wrb * kMvwWgs < a.tiles) set_wrow();
    }
  };
  // Activation: plane xp = 8 (tid / 64) + tid % 8, 16 B chunk xc = (tid / 8) % 8 (threads < 8 NP); planes past LV M
  // are zero-filled from a valid address.
  const int xt8 = tid & 7, xc = (tid >> 3) & 7, xp = (tid >> 6) * 8 + xt8;
  const uint32_t xdst = x_s + uint32_t((xp >> 3) * 1024 + xt8 * 128 + ((xc ^ xt8) << 4));
  const bool xok = tid < 8 * NP && xp < LV * M;
  const int8_t* xsrc = xok ? a.xq + int64_t(xp) * K + xc * 16 : a.xq;
  // Units: token column tid < TC, stored where the consumer reads it: q16 token 4j + q at [q][j], q8 token
  // 8j + 2q + e at [q][j][e] (a thread reads its NP / 8 or NP / 4 units as consecutive floats).
  const bool uok = tid < TC && tid < M;
  const float* usrc = &a.xds[(uok ? int64_t(tid) : 0) * C].x;
  const int uidx = LV == 2 ? (tid & 3) * (NP / 8) + (tid >> 2) : ((tid >> 1 & 3) * (NP / 8) + (tid >> 3)) * 2 + (tid & 1);
  const uint32_t udst = u_s + 4u * unsigned(uidx);
  int64_t xg = u0 % G;  // activation cursor: group
  auto issue_x = [&](int s) {
    if (tid < 8 * NP) cp_async16_s(xdst + uint32_t(s * Lay::x_bytes), xok ? xsrc + xg * 128 : a.xq, xok ? 16 : 0);
    if (tid < TC)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(udst + uint32_t(s * Lay::u_bytes)),
                   "l"(usrc + xg * 4), "r"(uok ? 4 : 0)
                   : "memory");
    if (++xg == G) xg = 0;
  };

  constexpr int P = S - 2;  // units issued ahead: a stage is refilled two units after its use, so a warpgroup
                            // may run one unit ahead of the slowest before it waits on `empty`
  for (int j = 0; j < P; ++j)  // weights first: constants, not written by earlier kernels
    if (j < n) issue_w(j);
  pdl_wait();
  for (int j = 0; j < P; ++j)
    if (j < n) {
      issue_x(j);
      cp_async_arrive(full(j));
    }

  // ---- consumer (every warpgroup) ----
  const int c = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int rr = c * 64 + warp * 16 + g;  // this thread's rows rr, rr + 8 of the row block
  const uint32_t sw = uint32_t(((rr >> 2) & 1) << 4);  // the chunk swap of rows rr and rr + 8 (same bit)
  int64_t crb = rb_first, cg = u0 % G, seg_g0 = cg;
  bool live = false;  // this warpgroup's tile of row block crb exists
  const __half *slo = nullptr, *shi = nullptr;
  float* yout = nullptr;
  int64_t yN = 0, lr_lo = 0;
  auto set_crow = [&]() {
    const int64_t tile = crb * kMvwWgs + c;
    live = tile < a.tiles;
    const MvwOut& O = a.o[out_of(tile)];
    lr_lo = (tile - O.t0) * 64 + warp * 16 + g;
    yout = O.y;
    yN = O.N;
    const __half* sc = reinterpret_cast<const __half*>(O.scales);
    slo = sc + (lr_lo < O.N ? lr_lo : O.N - 1) * G;
    shi = sc + (lr_lo + 8 < O.N ? lr_lo + 8 : O.N - 1) * G;
  };
  set_crow();

  float f[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) f[v] = 0.f;
  auto store = [&](const float (&val)[NV]) {
    if (!live) return;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const int64_t row = lr_lo + (LV == 2 ? 8 * (v & 1) : 8 * ((v >> 1) & 1));
      const int64_t tok = LV == 2 ? 4 * (v >> 1) + q : 8 * (v >> 2) + 2 * q + (v & 1);
      if (row < yN && tok < M) yout[tok * yN + row] = val[v];
    }
  };
  // The end of this block's stretch of row block crb: store it, or (cut between blocks) park it in this block's
  // slot and let the last block to arrive add the slots in block order.
  auto flush = [&](bool whole) {
    if (whole) {
      store(f);
    } else {
      const int64_t slot = 2 * int64_t(blockIdx.x) + (crb == rb_first ? 0 : 1);
#pragma unroll
      for (int v = 0; v < NV; ++v) a.part[(slot * NV + v) * kMvwThreads + tid] = f[v];
      __syncthreads();  // the block's partial is written
      if (tid == 0) {
        const int64_t b0 = mvw_owner(crb * G, U, nb), b1 = mvw_owner(crb * G + G - 1, U, nb);
        __threadfence();  // the partial before the count (threadFenceReduction pattern)
        last_flag = atomicAdd(&a.cnt[crb], 1) == int(b1 - b0);
      }
      __syncthreads();
      if (last_flag) {
        __threadfence();
        const int64_t b0 = mvw_owner(crb * G, U, nb), b1 = mvw_owner(crb * G + G - 1, U, nb);
        float sum[NV];
#pragma unroll
        for (int v = 0; v < NV; ++v) sum[v] = 0.f;
        for (int64_t b = b0; b <= b1; ++b) {  // block order: the same sum whoever arrives last
          const int64_t sl = 2 * b + (crb == mvw_begin(b, U, nb) / G ? 0 : 1);
#pragma unroll
          for (int v = 0; v < NV; ++v) sum[v] += __ldcg(&a.part[(sl * NV + v) * kMvwThreads + tid]);
        }
        store(sum);
        if (tid == 0) a.cnt[crb] = 0;  // ready for the next launch
      }
    }
#pragma unroll
    for (int v = 0; v < NV; ++v) f[v] = 0.f;
  };

#ifdef BONSAI_WGMMA
  int acc[R];
  const uint64_t desc0 = smem_desc(x_s, 0, 1);
  for (int64_t i = 0; i < n; ++i) {
    const int s = int(i % S);
    mbar_wait(full(s), uint32_t((i / S) & 1));
    // cp.async (generic proxy) writes, read by wgmma (async proxy).
    fence_async_smem();
    if (live) {
      const float2 dw = make_float2(__half2float(slo[cg]), __half2float(shi[cg]));  // latency under the wgmmas
      // Raw words of rows rr, rr + 8 (16 B chunk h at 16 (h ^ swap)): 4 LDS.128, the 4 lanes of a row broadcast.
      const unsigned char* rw = base + Lay::w_off + s * Lay::w_bytes + rr * 32;
      uint4 lo[2], hi[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t off = (uint32_t(h) << 4) ^ sw;
        lo[h] = *reinterpret_cast<const uint4*>(rw + off);
        hi[h] = *reinterpret_cast<const uint4*>(rw + 8 * 32 + off);
      }
      const uint32_t wl[8] = {lo[0].x, lo[0].y, lo[0].z, lo[0].w, lo[1].x, lo[1].y, lo[1].z, lo[1].w};
      const uint32_t wh8[8] = {hi[0].x, hi[0].y, hi[0].z, hi[0].w, hi[1].x, hi[1].y, hi[1].z, hi[1].w};
      // A fragments (as v3): word j holds element 16 j + 4 b + i at bits 8 b + 2 i, the transposed activation holds it
      // at byte 16 j + 4 i + b, so decode4(w >> 2q) of words 2 ks, 2 ks + 1 are k bytes 4q.. and 16 + 4q.. of k-step ks.
      uint32_t af[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        af[ks][0] = decode4(wl[2 * ks] >> (2 * q));
        af[ks][1] = decode4(wh8[2 * ks] >> (2 * q));
        af[ks][2] = decode4(wl[2 * ks + 1] >> (2 * q));
        af[ks][3] = decode4(wh8[2 * ks + 1] >> (2 * q));
      }
      pin(acc);
      wg_fence();
      const uint64_t db = desc0 + uint64_t(uint32_t(s * Lay::x_bytes) >> 4);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) mvw_wgmma(acc, af[ks], db + uint64_t((32 * ks) >> 4), ks);
      wg_commit();
      // This thread's units (q16: tokens 4j + q, j < NP / 8; q8: tokens 8j + 2q, + 1), read while the wgmmas run.
      float u[LV == 2 ? NP / 8 : NP / 4];
      const float* up = units + s * 32 + q * (LV == 2 ? NP / 8 : NP / 4);
#pragma unroll
      for (int k = 0; k < (LV == 2 ? NP / 8 : NP / 4); k += 4) {
        const float4 t4 = *reinterpret_cast<const float4*>(up + k);
        u[k] = t4.x, u[k + 1] = t4.y, u[k + 2] = t4.z, u[k + 3] = t4.w;
      }
      wg_wait<0>();
      pin(acc);
      // f += d_w u (254 I0 + I1) (q16) or d_w u I (q8): I2FP exact (|254 I0 + I1| < 2^24), as v3.
#pragma unroll
      for (int j = 0; j < NP / 8; ++j) {
        if constexpr (LV == 2) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int cc = acc[4 * j + 2 * h] * 254 + acc[4 * j + 2 * h + 1];
            f[2 * j + h] = fmaf((h ? dw.y : dw.x) * u[j], float(cc), f[2 * j + h]);
          }
        } else {
#pragma unroll
          for (int i2 = 0; i2 < 4; ++i2)
            f[4 * j + i2] = fmaf(((i2 >> 1) ? dw.y : dw.x) * u[2 * j + (i2 & 1)], float(acc[4 * j + i2]), f[4 * j + i2]);
        }
      }
    }
    mbar_arrive(empty(s));  // this thread's reads of stage s (raw words, units; its wgmmas) are done
    // Refill: unit i + P into the stage unit i + P - S used (all 512 threads done with it).
    const int64_t j = i + P;
    if (j < n) {
      const int sj = int(j % S);
      if (j >= S) mbar_wait(empty(sj), uint32_t((j / S - 1) & 1));
      issue_w(sj);
      issue_x(sj);
      cp_async_arrive(full(sj));
    }
    // End of a row block's stretch (block-uniform: i, cg are the same in every thread).
    if (cg == G - 1 || i == n - 1) {
      flush(seg_g0 == 0 && cg == G - 1);
      if (cg == G - 1 && i + 1 < n) {
        ++crb;
        set_crow();
      }
      seg_g0 = 0;
    }
    cg = cg == G - 1 ? 0 : cg + 1;
  }
#else
  (void)flush, (void)slo, (void)shi;
  __trap();  // built without sm_90a: the backend keeps off this kernel there (gemm2_supported)
#endif
  cp_async_wait<0>();
}

// Stages: as many as ~200 KB of shared memory hold (the weight stream needs bytes in flight: 12 x 8 KB per SM).
template <int NP>
constexpr int mvw_stages() {
  return NP == 64 ? 12 : 16;
}
template <int LV, int NP>
const void* mvw_func() {
  return reinterpret_cast<const void*>(&mvw_kernel<LV, NP, mvw_stages<NP>()>);
}
template <int NP>
uint32_t mvw_smem() {
  return uint32_t(1024 + MvwLayout<NP, mvw_stages<NP>()>::bytes);
}
int mvw_np(int levels, int64_t M) { return levels * M <= 32 ? 32 : 64; }

}  // namespace

bool matvec_wgmma_supported(int64_t M, int levels, int64_t K) {
  return M >= 1 && M <= 32 && (levels == 2 || levels == 1) && K % 128 == 0 && K >= 128 &&
         K <= (int64_t(1) << 24);
}

void init_matvec_wgmma_attributes() {
  cudaFuncSetAttribute(mvw_func<2, 64>(), cudaFuncAttributeMaxDynamicSharedMemorySize, int(mvw_smem<64>()));
  cudaFuncSetAttribute(mvw_func<2, 32>(), cudaFuncAttributeMaxDynamicSharedMemorySize, int(mvw_smem<32>()));
  cudaFuncSetAttribute(mvw_func<1, 32>(), cudaFuncAttributeMaxDynamicSharedMemorySize, int(mvw_smem<32>()));
}

int64_t matvec_wgmma_row_blocks(const TernaryDev* outs, int n_outs) {
  int64_t tiles = 0;
  for (int i = 0; i < n_outs; ++i) tiles += (outs[i].N + 63) / 64;
  return (tiles + kMvwWgs - 1) / kMvwWgs;
}

int64_t matvec_wgmma_part_floats(int sms) { return int64_t(2) * sms * 16 * kMvwThreads; }

Launch matvec_wgmma_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds,
                           int64_t M, int levels, int sms, float* part, int32_t* counters) {
  MvwArgs a{};
  a.xq = xq;
  a.xds = xds;
  a.part = part;
  a.cnt = counters;
  a.K = K;
  a.M = M;
  a.n_outs = n_outs;
  int64_t tiles = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, tiles};
    tiles += (outs[i].N + 63) / 64;
  }
  a.tiles = tiles;
  a.units = matvec_wgmma_row_blocks(outs, n_outs) * (K / 128);
  const int lv = levels == 2 ? 2 : 1;
  const int np = mvw_np(lv, M);
  const void* f = lv == 2 ? (np == 64 ? mvw_func<2, 64>() : mvw_func<2, 32>()) : mvw_func<1, 32>();
  const uint32_t smem = np == 64 ? mvw_smem<64>() : mvw_smem<32>();
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(sms, a.units));
  return make_launch(f, dim3(unsigned(blocks)), dim3(kMvwThreads), smem, a);
}

}  // namespace bonsai::cuda
