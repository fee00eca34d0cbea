// Ternary GEMM v3 (BONSAI_CUDA_GEMM=3): warp-specialised wgmma. Same inputs, outputs and split-K contract as
// gemm2_kernel (gemm_wgmma.cu, v2): y [M, N] fp32 = sum over 128-groups of d_w[row, g] * u_x[token, g] *
// (254 I0 + I1) (q16) or d_w u_x I0 (q8), the integer dots exact in int32, the per-group scaling in fp32.
//
// Why: v2's two warpgroups meet at a block barrier once per group and each scales its accumulators while
// its own tensor work has drained, so the tensor pipe idles for the scaling (round 5: ~3,800 cycles per
// group for ~1,024 of tensor work at 128 tokens). Here, per block of 128 weight rows x TOK tokens:
//   - warpgroup 0 = producer: cp.async of each group's raw words, the rows' fp16 scales (round 21), both digit
//     planes (128-byte swizzled K-major tiles) and the token units into a ring of S stages; each thread's
//     copies of a stage complete on that stage's `full` mbarrier (cp.async.mbarrier.arrive.noinc); it refills
//     a stage once both consumers have arrived on its `empty` mbarrier. No block barrier after the prologue.
//   - warpgroups 1, 2 = consumers, 64 rows each x all TOK tokens (wgmma n = TOK, up to 128): the weights go
//     to wgmma from REGISTERS: each thread decodes its own A fragment (rows g, g + 8 of its warp's 16,
//     k bytes 4q..4q+3 and 16+4q..) straight from the raw words (no decoded tile in shared memory, half
//     of v2's wgmma operand reads); B = the activation planes from the swizzled tiles.
//   - the two consumers take turns to ISSUE (named barriers 1 / 2): consumer 1 issues group kg after
//     consumer 0 has, consumer 0 issues kg + 1 after consumer 1 has issued kg. Their wgmmas queue on the
//     tensor pipe in that order, so while one consumer waits for and scales its group, the other's wgmmas
//     run (without the turn-taking both would issue together, finish together and scale together).
//   - setmaxnreg: the producer drops to 40 registers, the consumers rise to 232 (2 x 64 int32 + 64 fp32
//     accumulators at 128 tokens); 40 x 128 + 232 x 256 = 64,512 of the SM's 65,536 (ptxas, nvcc 13.0: no
//     spills; at 56 / 224 the consumers spilled 20-48 B).
//   - round 17, batched decode (9..32 tokens, grids of more blocks than SMs; Options::gemm3_occ): an instance of TWO
//     blocks per SM, each 7 stages (2 x 102 KB) with 40-register producers and 96-register consumers, so the four
//     consumer warpgroups of an SM overlap their per-group waits and scaling (gate+up M32 56.4 -> 44.6 us).
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/gemm3_fold.h"
#include "backend/cuda/gemm_fold.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ternary_dot.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/cuda/mbarrier.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kWsRows = 128;     // weight rows per block (2 consumer warpgroups x 64)
constexpr int kWsRawStride = 12;  // words per row of a raw stage (8 used): conflict-free 16 B reads and writes
constexpr int kWsThreads = 384;   // producer warpgroup + 2 consumer warpgroups

// Shared memory of one block, S stages (offsets from the 1024-aligned base).
template <int TOK, int L, int S>
struct WsLayout {
  static constexpr int x_bytes = L * TOK * 128;                    // [L][TOK / 8 atoms][1024 B] per stage
  static constexpr int raw_off = S * x_bytes;                      // [S][kWsRows][kWsRawStride] u32
  static constexpr int units_off = raw_off + S * kWsRows * kWsRawStride * 4;  // [S][TOK] float
  static constexpr int sc_off = units_off + S * TOK * 4;           // [S][kWsRows] u32: each row's d_w (an fp16 pair)
  static constexpr int bar_off = sc_off + S * kWsRows * 4;          // [2][S] u64: full, empty
  static constexpr int bytes = bar_off + 2 * S * 8;
  // Round 35's fault was a hand-carved region 8 bytes off its access width; these hold for every instantiation: each
  // stage's swizzle atoms on 1024 B (the base is), the raw words' and units' 16 B copies, the mbarriers' 8 B.
  static_assert(x_bytes % 1024 == 0 && raw_off % 16 == 0 && units_off % 16 == 0 && sc_off % 4 == 0 && bar_off % 8 == 0);
  static_assert(1024 + bytes <= 227 * 1024, "the launch asks for bytes + 1 KB (the base's rounding)");
};

#ifdef BONSAI_WGMMA
// One 128-group's wgmmas of a consumer: 4 k-steps, A (the group's fragments) from registers, B from the stage's plane
// tiles at descriptor db (plane 0, k-step 0): + (byte offset >> 4) in the start-address field (no carry out of its 14
// bits: shared addresses < 256 KB), so each wgmma adds a constant. k-step 0 starts the accumulators.
// Round 27: ONE wgmma of n = L x TOK per k-step over all L planes (not one of n = TOK per plane). The planes' tiles are
// adjacent in the stage (plane l at l TOK 128 bytes, the same 1024-byte atoms), so plane 1's tokens are simply rows TOK ..
// 2 TOK - 1 of one B operand; and the D fragment's register 4 j + i holds column 8 j + 2 q + (i & 1), so ac[l][x] (flat
// index l R + x, R = TOK / 2) is exactly the per-plane wgmma's register x of plane l: the same integer sums in the same
// registers, half the wgmma instructions and descriptors.
template <int L, int TOK, int R>
__device__ __forceinline__ void group_wgmmas(int (&ac)[L][R], const uint32_t (&fr)[4][4], uint64_t db) {
  static_assert(R == TOK / 2, "R: one plane's accumulators");
  int (&flat)[L * R] = *reinterpret_cast<int (*)[L * R]>(&ac);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_rs(flat, fr[ks], db + uint64_t((32 * ks) >> 4), ks);
}
#endif

// TOK tokens per block (32, 64 or 128), L digit planes, S ring stages; CVT: the scaling's int -> float as
// I2FP.F32.S32 (one instruction; 1) or the 1.5 x 2^23 mantissa add (i2f22, two full-rate ones; 0). Both exact:
// the outputs are bit-identical (|254 I0 + I1| < 2^24).
// Round 11b (Options::gemm3_fold): Gemm3Args::kt > 0 is the folded split, a 1-D grid of tiles (tile t = row block
// t % rb of token tile t / rb): tiles < nfull run all of K as one block each; every later tile runs as kt blocks, one
// K slice each, that write their partials to part [split tile][slice][R][256 consumer threads] and count themselves
// on cnt [split tile]; the last of a tile's kt blocks sums the kt partials in slice order (its own from registers)
// and writes y, and puts the counter back to zero. The same sum, in the same order, as splitk_sum_kernel over the
// same slices, so a GEMM whose every tile is split (nfull 0) is bit-identical to gemm3 + the sum kernel.
struct Gemm3Args {
  Gemm2Args g;
  float* part;
  int32_t* cnt;
  int64_t nfull, rb;
  int32_t kt, pad;
};

// MINB blocks per SM (round 17): 2 halves every thread's registers (the launch bound's 80; producer 40, consumers 96:
// enough for TOK = 32's 2 x 16 int32 + 16 fp32 accumulators) so two blocks' warps hide each other's per-group latency.
// RU (round 19): the site quantised every row with ONE unit (site_row_units), so a group is scaled by d_w alone
// (f += d_w (254 I0 + I1): no FMUL d_w u_x per output and group, no unit copies or loads) and each output by its
// token's unit once, before the fold's sum and the store.
// DB (round 25, batched decode; Options::gemm3_occ 3 / 4): TOK = 32 on one block per SM, each consumer with TWO
// accumulator sets: it issues group kg + 1's wgmmas before it waits for group kg's and scales them, so its own tensor
// work covers its scaling and waits (the two-block instance's 96 registers cannot hold the second set: 2 x 2 x 16 int32
// + 16 fp32 + 2 x 16 A fragments). 1: with the turn-taking, 2: without. The same sums in the same order as DB 0.
template <int TOK, int L, int S, int CVT, int MINB = 1, bool RU = false, int DB = 0>
__global__ __launch_bounds__(kWsThreads, MINB) void gemm3_kernel(const Gemm3Args fa) {
  static_assert(MINB == 1 || (MINB == 2 && TOK == 32), "two blocks per SM only fit TOK = 32's accumulators");
  static_assert(DB == 0 || (TOK == 32 && MINB == 1 && !RU), "double-buffered accumulators: the one-block 32-token tile");
  const Gemm2Args& a = fa.g;
  static_assert(TOK == 32 || TOK == 64 || TOK == 128);
  using Lay = WsLayout<TOK, L, S>;
  constexpr int R = TOK / 2;  // int32 accumulators per thread and plane (64 x TOK / 128)
  extern __shared__ __align__(128) unsigned char g3_smem[];
  // Swizzle atoms need 1024 B alignment: the base is rounded up (the launch adds 1 KB).
  unsigned char* base = g3_smem + ((1024 - (smem_u32(g3_smem) & 1023)) & 1023);
  uint32_t* raw = reinterpret_cast<uint32_t*>(base + Lay::raw_off);   // [S][kWsRows][kWsRawStride]
  float* units = reinterpret_cast<float*>(base + Lay::units_off);     // [S][TOK] (0 past M)
  const uint32_t* scs = reinterpret_cast<const uint32_t*>(base + Lay::sc_off);  // [S][kWsRows] fp16 pairs
  const uint32_t x_s = smem_u32(base), bar_s = smem_u32(base + Lay::bar_off);
  auto full = [&](int s) { return bar_s + 8u * unsigned(s); };
  auto empty = [&](int s) { return bar_s + 8u * unsigned(S + s); };

  const FoldTile ft = fold_tile(fa.kt, fa.nfull, fa.rb, a.ks);
  const int64_t bx = ft.bx, by = ft.by, kz = ft.kz, ksl = ft.ksl, split = ft.split;
  const int o = fold_out(a.o, a.n_outs, bx);
  const int64_t N = a.o[o].N, K = a.K, M = a.M, KW = K / 16, G = K / 128, C = K / 64;
  const int64_t k0 = G * kz / ksl, NG = G * (kz + 1) / ksl - k0;
  const int64_t row0 = (bx - a.o[o].b0) * kWsRows;
  const int64_t tok0 = by * TOK;
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 128);  // one cp.async arrival per producer thread
      mbar_init(empty(s), 256);  // every consumer thread, once its wgmmas and scaling are done with the stage
    }
  }
  __syncthreads();
  pdl_trigger();

  if (tid < 128) {
    // ---------------- producer ----------------
#ifdef BONSAI_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
#endif
    // Every copy address is set up once here and advanced by one group per iteration: the producer warps
    // share their schedulers with the consumers, so its per-group instructions come off their issue slots.
    // Raw words: copies i = 0, 1 of this thread: row wr + 64 i, wr = 8 (tid / 16) + tid % 8, words 4 ((tid / 8)
    // & 1) .. + 3 (8 consecutive threads fill 8 rows of one 16 B column: conflict-free).
    const int wr = (tid >> 4) * 8 + (tid & 7), wh = (tid >> 3) & 1;  // copy 1: row wr + 64
    const int64_t wr0 = row0 + wr < N ? row0 + wr : N - 1, wr1 = row0 + wr + 64 < N ? row0 + wr + 64 : N - 1;
    const uint32_t* wsrc = a.o[o].words + wr0 * KW + k0 * 8 + wh * 4;
    const uint32_t woff1 = uint32_t((wr1 - wr0) * KW);  // words from copy 0's source to copy 1's
    const uint32_t wdst = smem_u32(&raw[wr * kWsRawStride + wh * 4]);
    const int wb0 = row0 + wr < N ? 16 : 0, wb1 = row0 + wr + 64 < N ? 16 : 0;
    // Activation planes: this thread copies 16 B chunk cc of token tgb * 8 + t8 + 16 j (j < TOK / 16) of each
    // plane, i.e. row t8 of 8-token atoms tgb + 2 j (8 consecutive threads fill 8 rows of one chunk column:
    // conflict-free). Tokens past M are zero-filled (src_bytes 0) from a valid address.
    constexpr int J = TOK / 16;
    const int t8 = tid & 7, cc = (tid >> 3) & 7, tgb = tid >> 6;
    const uint32_t xdst = x_s + uint32_t((tgb * 8 + t8) * 128 + ((cc ^ t8) << 4));  // + s x_bytes + l TOK 128 + 2048 j
    const int64_t tokb = tok0 + tgb * 8 + t8;
    const int nvalid = tokb < M ? int((M - tokb + 15) / 16) : 0;  // copies j < nvalid hold real tokens
    const int8_t* xsrc = a.xq + (tokb < M ? tokb : 0) * L * K + k0 * 128 + cc * 16;
    const int64_t jstride = 16 * L * K;
    // Units: token tid (< TOK) of the tile.
    const int64_t utok = tok0 + (tid < TOK ? tid : 0);
    const float* usrc = &a.xds[(utok < M ? utok : M - 1) * C + k0 * 2].x;  // + 4 floats (2 chunks) per group
    const uint32_t udst = smem_u32(units) + 4u * unsigned(tid);
    // Scales: row tid's d_w of group kg is fp16 element sc_e0 + kg of the output's [N, G] scales (rows past N: N - 1's).
    const int64_t sc_e0 = (row0 + tid < N ? row0 + tid : N - 1) * G + k0;
    const uint32_t scdst = smem_u32(scs) + 4u * unsigned(tid);
    auto issue_w = [&](int64_t kg, int s) {
      const uint32_t d = wdst + uint32_t(s * kWsRows * kWsRawStride * 4);
      cp_async16_s(d, wsrc + kg * 8, wb0);
      cp_async16_s(d + 64 * kWsRawStride * 4, wsrc + kg * 8 + woff1, wb1);
    };
    auto issue_x = [&](int64_t kg, int s) {
      const uint32_t dst = xdst + uint32_t(s * Lay::x_bytes);
      int64_t js = jstride, lk = K;
      asm volatile("" : "+l"(js), "+l"(lk));  // opaque: the 16 source pointers are not hoisted out of the
                                              // group loop (32 registers; the producer has 56)
      const int8_t* src = xsrc + kg * 128;
#pragma unroll
      for (int j = 0; j < J; ++j, src += js)
#pragma unroll
        for (int l = 0; l < L; ++l)
          cp_async16_s(dst + uint32_t(l * TOK * 128 + j * 2048), j < nvalid ? src + l * lk : a.xq, j < nvalid ? 16 : 0);
      // Row tid's d_w of the group: the 4-byte-aligned fp16 pair that holds it (the pair after an odd N x G count's
      // last scale lies in the upload's kScaleTail).
      cp_async4_s(scdst + uint32_t(s * kWsRows * 4), a.o[o].scales + ((sc_e0 + kg) & ~int64_t(1)));
      if (!RU && tid < TOK)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(udst + uint32_t(s * TOK * 4)),
                     "l"(usrc + kg * 4), "r"(utok < M ? 4 : 0)
                     : "memory");
    };
    for (int j = 0; j < S; ++j)  // weights first: they do not depend on earlier kernels
      if (j < NG) issue_w(j, j);
    pdl_wait();
    // Ring position s = kg % S and the parity of kg / S as running counters (a 64-bit division by S per group cost
    // ~12 uniform-datapath instructions in every thread; round 14).
    int s = 0;
    uint32_t ph = 0;
    for (int64_t kg = 0; kg < NG; ++kg) {
      if (kg >= S) {
        mbar_wait(empty(s), ph ^ 1u);  // the consumers are done with group kg - S
        issue_w(kg, s);
      }
      issue_x(kg, s);
      cp_async_arrive(full(s));
      if (++s == S) s = 0, ph ^= 1u;
    }
    cp_async_wait<0>();
  } else {
    // ---------------- consumers ----------------
#ifdef BONSAI_WGMMA
    // MINB 2: 80 -> 96. The consumers may take only what their CTA's producer released (128 x 40 = 5,120: 20 each,
    // 16 in steps of 8); an inc past that never returns (round 17's first device call hung at 104). At 80 (no
    // setmaxnreg) ptxas spilled 100 bytes.
    if constexpr (MINB == 1) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 96;");
#endif
    pdl_wait();
    const int c = (tid >> 7) - 1, ct = tid & 127, warp = ct >> 5, lane = ct & 31, g = lane >> 2, q = lane & 3;
    float* y = a.o[o].y + (fa.kt > 0 ? 0 : kz * a.part_stride);
    // Rows of this thread's A fragment and accumulators (wgmma D layout: warp w rows 16 w + g and + 8;
    // register 4 j + i: column 8 j + 2 q + (i & 1), row + 8 when i >= 2).
    const int wrow = c * 64 + warp * 16 + g;
    const int64_t rlo = row0 + wrow, rhi = rlo + 8;
    // d_w of rows rlo, rhi for group kg, from stage st: the half of each row's pair that holds it (a pair starts at an
    // even element of [N, G], so which half alternates with kg).
    const int plo = int(((rlo < N ? rlo : N - 1) * G + k0) & 1), phi = int(((rhi < N ? rhi : N - 1) * G + k0) & 1);
    auto dw_of = [&](int64_t kg, int st) {
      const __half* p = reinterpret_cast<const __half*>(scs + st * kWsRows + wrow);  // row wrow's pair; + 16: wrow + 8
      return make_float2(__half2float(p[(plo + int(kg)) & 1]), __half2float(p[16 + ((phi + int(kg)) & 1)]));
    };

    int acc[L][R];  // [plane][register]
    float f[R];     // fp32 sums over groups
#pragma unroll
    for (int i = 0; i < R; ++i) {
      f[i] = 0.f;
#pragma unroll
      for (int l = 0; l < L; ++l) acc[l][i] = 0;
    }
#ifdef BONSAI_WGMMA
    const uint64_t desc0 = smem_desc(x_s, 0, 1);
    const int my_turn = c == 0 ? 1 : 2, next_turn = c == 0 ? 2 : 1;  // named barrier ids (0 = __syncthreads)
    int s = 0;  // kg % S and the parity of kg / S, as the producer's
    uint32_t ph = 0;
    if constexpr (DB > 0) {
      // Group kg into accumulator set ac (its A fragments in fr, which stay untouched until the wait that retires it).
      auto issue = [&](int64_t kg, int (&ac)[L][R], uint32_t (&fr)[4][4]) {
        mbar_wait(full(s), ph);
        fence_async_smem();
        v3_fragments(&raw[(s * kWsRows + wrow) * kWsRawStride], kWsRawStride, q, fr);
        if (DB == 1 && (c == 1 || kg > 0)) named_sync(my_turn, 256);
#pragma unroll
        for (int l = 0; l < L; ++l) pin(ac[l]);
        pin(fr);  // every A fragment defined before the fence (else ptxas injects a warpgroup.arrive per k-step)
        wg_fence();
        group_wgmmas<L, TOK>(ac, fr, desc0 + uint64_t(uint32_t(s * Lay::x_bytes) >> 4));
        wg_commit();
        if (DB == 1 && (c == 0 || kg + 1 < NG)) named_arrive(next_turn, 256);
        const int st = s;
        if (++s == S) s = 0, ph ^= 1u;
        return st;
      };
      // Group kg's scaling from set ac once its wgmmas are retired, then its stage st back to the producer.
      auto finish = [&](int64_t kg, int st, int (&ac)[L][R], uint32_t (&fr)[4][4]) {
#pragma unroll
        for (int l = 0; l < L; ++l) pin(ac[l]);
        pin(fr);
        scale_group<L, R, CVT, RU>(ac, f, units + st * TOK, dw_of(kg, st), q);
        mbar_arrive(empty(st));
      };
      int acc2[L][R];  // the second set (acc: the first); no zeroing needed: each group's first k-step has scale-d 0
      uint32_t af0[4][4], af1[4][4];
      // Pairs of groups in the loop and the odd one after it: no early exit between a set's issue and its wait
      // (ptxas serialises the wgmmas otherwise, round 19).
      int st0 = issue(0, acc, af0), st1 = 0;
      int64_t kg = 1;
      for (; kg + 1 < NG; kg += 2) {
        st1 = issue(kg, acc2, af1);
        wg_wait<1>();
        finish(kg - 1, st0, acc, af0);
        st0 = issue(kg + 1, acc, af0);
        wg_wait<1>();
        finish(kg, st1, acc2, af1);
      }
      if (kg < NG) {
        st1 = issue(kg, acc2, af1);
        wg_wait<1>();
        finish(kg - 1, st0, acc, af0);
        wg_wait<0>();
        finish(kg, st1, acc2, af1);
      } else {
        wg_wait<0>();
        finish(kg - 1, st0, acc, af0);
      }
    } else
    for (int64_t kg = 0; kg < NG; ++kg) {
      mbar_wait(full(s), ph);
      // The producer's cp.async (generic proxy) writes, read by wgmma (async proxy). ptxas makes this a
      // MEMBAR.ALL.CTA, which waits for the thread's outstanding loads.
      fence_async_smem();
      // Round 21: d_w from the stage (the producer copied it with the group). Loaded from global memory here, its L2
      // latency was exposed at 32 tokens, where a group's wgmmas are short (H200: gate+up M32 48.0 -> 46.1 us).
      const float2 dw = dw_of(kg, s);
      uint32_t af[4][4];  // the group's A fragments (ternary_dot.cuh)
      v3_fragments(&raw[(s * kWsRows + wrow) * kWsRawStride], kWsRawStride, q, af);
      if (c == 1 || kg > 0) named_sync(my_turn, 256);  // the other consumer has issued its previous group
#pragma unroll
      for (int l = 0; l < L; ++l) pin(acc[l]);
      pin(af);  // every A fragment defined before the fence (else ptxas injects a warpgroup.arrive per k-step)
      wg_fence();
      // B descriptor: the stage's plane-0 tile at k-step 0 (group_wgmmas adds each k-step's offset; the planes are one operand).
      group_wgmmas<L, TOK>(acc, af, desc0 + uint64_t(uint32_t(s * Lay::x_bytes) >> 4));
      wg_commit();
      if (c == 0 || kg + 1 < NG) named_arrive(next_turn, 256);  // its turn (consumer 1 skips its last)
      wg_wait<0>();
#pragma unroll
      for (int l = 0; l < L; ++l) pin(acc[l]);
      scale_group<L, R, CVT, RU>(acc, f, units + s * TOK, dw, q);  // f += d_w u_x (254 I0 + I1); RU: d_w (..)
      mbar_arrive(empty(s));  // this thread's reads of stage s (raw words, scales, units; its wgmmas) are done
      if (++s == S) s = 0, ph ^= 1u;
    }
#else
    (void)plo, (void)phi, (void)acc;
    __trap();  // built without sm_90a: gemm3_supported() keeps the backend off this kernel
#endif
    if constexpr (RU) {  // the token units: any chunk of a row holds its row's unit (chunk 0 here)
#pragma unroll
      for (int j = 0; j < R / 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t tok = tok0 + 8 * j + 2 * q + e;
          const float u = tok < M ? a.xds[tok * C].x : 0.f;
          f[4 * j + e] *= u;
          f[4 * j + e + 2] *= u;
        }
    }
    if (split >= 0 && !fold_sum(f, fa.part, fa.cnt, split, kz, ksl, tid - 128)) return;  // folded split
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = i & 2 ? rhi : rlo;
      const int64_t tok = tok0 + 8 * (i >> 2) + 2 * q + (i & 1);
      if (row < N && tok < M) y[tok * N + row] = f[i];
    }
  }
}

struct Gemm3Pick {
  const void* func;
  uint32_t smem;
  int tok;
};
// Stages: as deep as ~200 KB of shared memory allows (the weight stream of small M needs bytes in flight).
template <int TOK, int L, int S, int CVT, int MINB = 1, bool RU = false, int DB = 0>
Gemm3Pick gemm3_cfg() {
  return {reinterpret_cast<const void*>(&gemm3_kernel<TOK, L, S, CVT, MINB, RU, DB>),
          uint32_t(1024 + WsLayout<TOK, L, S>::bytes), TOK};
}

// occ 2 (M <= 32 only): two blocks per SM of 7 stages each (2 x 102 KB); occ 3 / 4 (round 25): one block of 12 stages
// with double-buffered accumulators, with / without the turn-taking.
template <int L, int CVT, bool RU = false>
Gemm3Pick gemm3_pick_l(int64_t M, int occ) {
  if constexpr (!RU)
    if (M <= 32)
      return occ == 2   ? gemm3_cfg<32, L, 7, CVT, 2>()
             : occ == 3 ? gemm3_cfg<32, L, 12, CVT, 1, false, 1>()
             : occ == 4 ? gemm3_cfg<32, L, 12, CVT, 1, false, 2>()
                        : gemm3_cfg<32, L, 12, CVT>();
  return M <= 64 ? gemm3_cfg<64, L, 8, CVT, 1, RU>() : gemm3_cfg<128, L, 5, CVT, 1, RU>();
}
// Row units (ru) have I2FP instances of 64 and 128 tokens only: the row-unit site needs >= 64 rows
// (site_row_units). Dropping ru is always exact: xds then holds the row's unit in every chunk, which the
// per-group scaling reads.
Gemm3Pick gemm3_pick(int levels, int64_t M, int cvt, int occ, bool ru = false) {
  ru = ru && M > 32;
  if (ru) return levels == 2 ? gemm3_pick_l<2, 1, true>(M, occ) : gemm3_pick_l<1, 1, true>(M, occ);
  if (cvt) return levels == 2 ? gemm3_pick_l<2, 1>(M, occ) : gemm3_pick_l<1, 1>(M, occ);
  return levels == 2 ? gemm3_pick_l<2, 0>(M, occ) : gemm3_pick_l<1, 0>(M, occ);
}
// Blocks of the pick that run at once on one SM.
int gemm3_blocks_per_sm(int64_t M, int occ) { return M <= 32 && occ == 2 ? 2 : 1; }

}  // namespace

void init_gemm3_attributes() {
  for (int lv : {1, 2})
    for (int cvt : {0, 1})
    for (int occ : {1, 2, 3, 4})
    for (bool ru : {false, true})
    for (int64_t m : {32, 64, 128}) {
      const Gemm3Pick p = gemm3_pick(lv, m, cvt, occ, ru);
      cudaFuncSetAttribute(p.func, cudaFuncAttributeMaxDynamicSharedMemorySize, int(p.smem));
    }
}

int gemm3_ksplit(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int occ) {
  const Gemm3Pick p = gemm3_pick(levels == 2 ? 2 : 1, M, 0, occ);
  return wave_ksplit(gemm_blocks(outs, n_outs, M, kWsRows, p.tok), sms * gemm3_blocks_per_sm(M, occ), K / 128);
}

Launch gemm3_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                    int levels, int ks, int64_t part_stride, int cvt, int occ, bool row_units) {
  const Gemm3Pick p = gemm3_pick(levels == 2 ? 2 : 1, M, cvt, occ, row_units);
  Gemm3Args a{};
  a.g = gemm_args(outs, n_outs, K, xq, xds, M, ks, part_stride, /*swizzle=*/true, kWsRows);
  const dim3 grid{unsigned(gemm_row_blocks(outs, n_outs, kWsRows)), unsigned((M + p.tok - 1) / p.tok), unsigned(ks)};
  return make_launch(p.func, grid, dim3(kWsThreads), p.smem, a);
}

Gemm3Fold gemm3_fold_plan(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int occ) {
  const Gemm3Pick p = gemm3_pick(levels == 2 ? 2 : 1, M, 0, occ);
  return fold_plan(gemm_blocks(outs, n_outs, M, kWsRows, p.tok), sms * gemm3_blocks_per_sm(M, occ), K / 128,
                   int64_t(kWsRows) * p.tok);
}

int gemm3_occ_rule(int opt, const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms) {
  if (M <= 8 || M > 32) return 1;
  if (opt == 3 || opt == 4) return opt;
  if (opt == 5) return gemm3_fold_plan(outs, n_outs, K, M, levels, sms, 2).tiles >= 2 * sms ? 2 : 4;
  if (opt == 2 && gemm3_fold_plan(outs, n_outs, K, M, levels, sms, 2).tiles * gemm3_ksplit(outs, n_outs, K, M, levels, sms, 2) > sms)
    return 2;
  return 1;
}

Gemm3Fold fold_plan(int64_t B, int sms, int64_t G, int64_t tile_floats) {
  Gemm3Fold f{B, B, 1, tile_floats};
  if (B < sms) {  // all tiles split, as the unfused rule (wave_ksplit) cuts them: bit-identical to it
    f.kt = wave_ksplit(B, sms, G);
    if (f.kt > 1) f.nfull = 0;
    return f;
  }
  const int64_t T = B % sms;  // the last, partial wave: its tiles cut in K over the idle SMs
  const int64_t kt = T == 0 ? 1 : std::min<int64_t>({sms / T, kGemm3FoldMaxSlices, G / kGemm3FoldMinGroups});
  if (kt >= 2) {
    f.kt = int(kt), f.nfull = B - T;
  } else {  // a tail of more than half a wave: every tile split where the unfused rule splits them (bit-identical)
    f.kt = wave_ksplit(B, sms, G);
    if (f.kt > 1) f.nfull = 0;
  }
  return f;
}

Launch gemm3_fold_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                         int levels, const Gemm3Fold& f, float* part, int32_t* cnt, int cvt, int occ,
                         bool row_units) {
  const Gemm3Pick p = gemm3_pick(levels == 2 ? 2 : 1, M, cvt, occ, row_units);
  Gemm3Args a{};
  a.g = gemm_args(outs, n_outs, K, xq, xds, M, f.kt, 0, /*swizzle=*/true, kWsRows);
  a.part = part;
  a.cnt = cnt;
  a.nfull = f.nfull;
  a.rb = gemm_row_blocks(outs, n_outs, kWsRows);
  a.kt = f.kt;
  const dim3 grid{unsigned(f.nfull + (f.tiles - f.nfull) * f.kt)};
  return make_launch(p.func, grid, dim3(kWsThreads), p.smem, a);
}

}  // namespace bonsai::cuda
