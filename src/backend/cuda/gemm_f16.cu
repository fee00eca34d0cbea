// GEMM v4 (Options::gemm_f16, round 13): the ternary product on the fp16 tensor cores, with each 128-group's scale
// folded into the weights, so there is no per-group scaling step at all.
//
// Why: GEMM v3 (gemm_ws.cu) multiplies int8 digits exactly, but every 128-group ends in a wait for the group's
// wgmmas and a scaling of the int32 accumulators (254 I0 + I1, I2F, d_w u_x, FFMA: ~4.5 instructions per output and
// group). ncu with source counters (round 13, call 1) put its consumers at ~234 warp instructions per group and one
// group in flight: 43 % of the int8 peak at 256 tokens, ~7x the byte floor at 32. Here A = (code - 1) * d_w is exact
// in fp16 (d_w is an fp16 number), B = the activation in fp16, and the accumulators are fp32 over the whole K: the
// tensor pipe never waits for a scaling, and consecutive groups' wgmmas overlap the next group's decode.
// The price is the activation's precision: fp16 (11 significant bits) instead of q16's ~16 (bonsai gate on the tiny
// pack, cpu backend with its site outputs rounded to fp16: 726/726, max |dlogit| 0.023, KL 2.7e-6; q16 2.0e-3 /
// 4.3e-8). At 256 tokens the fp16 tensor work equals q16's int8 work (half the rate, one plane instead of two).
//
// Two kernels:
//   xh_pack_kernel: the site's q16 / q8 digits (xq, xds) -> xh, the activation in fp16 already laid out as the
//     GEMM's shared-memory B tiles: [ceil(M / 8) atoms of 8 tokens][K / 64][1024 B], row r of an atom at 128 r, its
//     16 B chunk c at 16 (c ^ r) (the 128-byte swizzle), so a token tile's group is one 2 KB bulk copy per atom
//     (async proxy: no proxy fence before wgmma reads it). Inside each 16-element word the k slots are permuted so
//     that thread q of a quad finds its 4 weights of the word at bits 2q + {0, 8, 16, 24} (below).
//   gemmh_kernel<TOK, RB, S>: a producer warpgroup (cp.async of the raw words, bulk copies of xh) and two consumer
//     warpgroups of RB 64-row tiles each, TOK tokens, an mbarrier ring of S stages of one 128-group; GEMM v3's folded
//     split (gemm_fold.cuh); gemmh_plan picks the block shape per product.
// Measured (H200, docs/cuda-kernels.md round 13; us, v4 / v3): gate+up M256 161.5 / 205.1, ffn_down 87.5 / 114.7,
// qkv+z 69.9 / 95.5, gate+up M32 46.4 / 58.2; pp2048 +20 % with --act f16.
//
// A fragments (wgmma m64nNk16, f16 from registers; warp w rows 16 w + g, + 8; a0 / a1 k slots 2q, 2q + 1 of rows g /
// g + 8, a2 / a3 slots 2q + 8, 2q + 9): a canonical word holds element 16 i + 4 b + j at bits 8 b + 2 j. With k slot
// 2q <- element q (b 0), 2q + 1 <- 8 + q (b 2), 2q + 8 <- 4 + q (b 1), 2q + 9 <- 12 + q (b 3), thread q's w >> 2q has
// a0's two codes at bits 0 and 16 and a2's at 8 and 24: (w & 0x00030003) | 0x64006400 is the half2 (1024 + c),
// minus 1025 is c - 1 exactly, times d_w exactly. In xq's transposed word (position 4 j + b holds element 4 b + j)
// slots 0..7 are positions 0, 2, .., 14 and slots 8..15 positions 1, 3, .., 15.
#include <cuda_fp16.h>

#include <algorithm>
#include <iterator>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm3_fold.h"
#include "backend/cuda/gemm_fold.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/wgmma.cuh"

namespace bonsai::cuda {

namespace {

// ---------------------------------------- xh_pack ----------------------------------------------------------------

struct XhPackArgs {
  const int8_t* xq;    // [M, levels, K] digit planes (transposed words)
  const float2* xds;   // [M, K/64] {unit, digit sum}
  unsigned char* xh;   // [rows8 / 8][K / 64][1024 B]
  int64_t M, K, rows8;
  int32_t levels, pad;
};

// One thread per (row, 16-element word): both 16 B chunks of the word's k16 step.
__global__ void xh_pack_kernel(const XhPackArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t W = a.K >> 4;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.rows8 * W) return;
  const int64_t m = idx / W, i = idx - m * W;
  uint32_t out[2][4] = {};  // [chunk][4 half2]
  if (m < a.M) {
    const int8_t* p = a.xq + m * a.levels * a.K + 16 * i;
    int8_t d0[16], d1[16] = {};
    *reinterpret_cast<int4*>(d0) = *reinterpret_cast<const int4*>(p);
    if (a.levels == 2) *reinterpret_cast<int4*>(d1) = *reinterpret_cast<const int4*>(p + a.K);
    const float u = a.xds[m * (a.K >> 6) + (i >> 2)].x;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int s = 0; s < 8; s += 2) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = h + 2 * (s + e);
          const int Q = a.levels == 2 ? 254 * int(d0[pos]) + int(d1[pos]) : int(d0[pos]);
          v[e] = fminf(fmaxf(u * float(Q), -65504.f), 65504.f);  // saturate: fp16 has no room past 65504
        }
        const __half2 hv = __floats2half2_rn(v[0], v[1]);
        out[h][s >> 1] = *reinterpret_cast<const uint32_t*>(&hv);
      }
  }
  const int r = int(m & 7), t = int(i & 3);
  unsigned char* row = a.xh + ((m >> 3) * (a.K >> 6) + (i >> 2)) * 1024 + r * 128;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    *reinterpret_cast<uint4*>(row + (((2 * t + h) ^ r) << 4)) = make_uint4(out[h][0], out[h][1], out[h][2], out[h][3]);
}

// ---------------------------------------- gemmh ------------------------------------------------------------------

constexpr int kHThreads = 384;    // producer warpgroup + 2 consumer warpgroups
constexpr int kHRawStride = 12;   // words per row of a raw stage (8 used): conflict-free 16 B reads, as GEMM v3

// Shared memory of one block, S stages (offsets from the 1024-aligned base).
template <int TOK, int RB, int S>
struct HLayout {
  static constexpr int rows = 128 * RB;                             // weight rows per block
  static constexpr int x_bytes = TOK * 256;                         // [TOK / 8 atoms][2 k halves][1024 B]
  static constexpr int raw_bytes = rows * kHRawStride * 4;          // [rows][kHRawStride] u32
  static constexpr int raw_off = S * x_bytes;
  static constexpr int bar_off = raw_off + S * raw_bytes;           // [2][S] u64: full, empty
  static constexpr int bytes = bar_off + 2 * S * 8;
};

// kt > 0: the folded split (as GEMM v3's, gemm_ws.cu): a 1-D grid of tiles (tile t = row block t % rb of token tile
// t / rb); tiles < nfull run all of K, every later tile runs as kt blocks of one K slice each, which store their partials
// to part [split tile][slice][RB R][256 consumer threads] and count themselves on cnt [split tile]; the last of a tile's
// kt blocks adds the kt partials in slice order, writes y and puts the counter back to zero.
struct GemmHArgs {
  Gemm2Out o[kMaxOuts];
  const unsigned char* xh;
  float* part;
  int32_t* cnt;
  int64_t K, M, part_stride, nfull, rb;
  int32_t n_outs, ks, kt, pad;
};

#ifdef BONSAI_WGMMA
// wgmma m64nNk16 f32 += f16 x f16, A (64 x 16 weights) from registers, B (N tokens x 16, K-major) from shared memory.
__device__ __forceinline__ void wgmma_h(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_h(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_h(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// Two weights -> their half2 (c - 1) d: w holds the codes at bits 0 and 16 (other bits masked off). magic = 0x64006400
// in a register: (w & 0x00030003) | magic is then ONE lop3 (with both constants as immediates ptxas emitted an AND and
// an OR: 65 of the ~228 instructions per unit were LOP3s, round 13's ncu).
__device__ __forceinline__ uint32_t dec2(uint32_t w, __half2 d, uint32_t magic) {
  uint32_t h;
  asm("lop3.b32 %0, %1, 0x00030003, %2, 0xEA;" : "=r"(h) : "r"(w), "r"(magic));  // (a & b) | c
  const __half2 v = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&h), __half2half2(__ushort_as_half(0x6401))), d);
  return *reinterpret_cast<const uint32_t*>(&v);
}
#endif

template <int TOK, int RB, int S>
__global__ __launch_bounds__(kHThreads, 1) void gemmh_kernel(const GemmHArgs a) {
  static_assert((TOK == 32 || TOK == 64 || TOK == 128) && (RB == 1 || RB == 2));
  using Lay = HLayout<TOK, RB, S>;
  constexpr int R = TOK / 2;  // fp32 accumulators per thread and 64-row tile
  extern __shared__ __align__(128) unsigned char gh_smem[];
  // Swizzle atoms need 1024 B alignment: the base is rounded up (the launch adds 1 KB).
  unsigned char* base = gh_smem + ((1024 - (smem_u32(gh_smem) & 1023)) & 1023);
  const uint32_t x_s = smem_u32(base), raw_s = x_s + Lay::raw_off, bar_s = x_s + Lay::bar_off;
  auto full = [&](int s) { return bar_s + 8u * unsigned(s); };
  auto empty = [&](int s) { return bar_s + 8u * unsigned(S + s); };

  const FoldTile ft = fold_tile(a.kt, a.nfull, a.rb, a.ks);
  const int64_t bx = ft.bx, by = ft.by, kz = ft.kz, ksl = ft.ksl, split = ft.split;
  const int o = fold_out(a.o, a.n_outs, bx);
  const int64_t N = a.o[o].N, K = a.K, M = a.M, KW = K / 16, G = K / 128, KC = K / 64;
  const int64_t k0 = G * kz / ksl, NG = G * (kz + 1) / ksl - k0;
  const int64_t row0 = (bx - a.o[o].b0) * Lay::rows, tok0 = by * TOK;
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 129);   // 128 producer cp.async arrivals + the bulk copies' expect_tx arrival
      mbar_init(empty(s), 256);  // every consumer thread, once the stage's last tile's wgmmas are done
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the bulk copies' complete_tx
  }
  __syncthreads();
  pdl_trigger();

  if (tid < 128) {
    // ---------------- producer ----------------
#ifdef BONSAI_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
#endif
    // Raw words: copy i < 2 RB of this thread: row wr + 64 i, words 4 wh .. 4 wh + 3 of the group (8 consecutive threads
    // fill 8 rows of one 16 B column: conflict-free). Rows past N are zero-filled from a valid address.
    const int wr = (tid >> 4) * 8 + (tid & 7), wh = (tid >> 3) & 1;
    const uint32_t* wsrc = a.o[o].words + k0 * 8 + wh * 4;
    const uint32_t wdst = raw_s + uint32_t((wr * kHRawStride + wh * 4) * 4);
    auto issue_w = [&](int64_t kg, int s) {
#pragma unroll
      for (int i = 0; i < 2 * RB; ++i) {
        const int64_t row = row0 + wr + 64 * i;
        cp_async16_s(wdst + uint32_t(s * Lay::raw_bytes + 64 * i * kHRawStride * 4),
                     wsrc + (row < N ? row : N - 1) * KW + kg * 8, row < N ? 16 : 0);
      }
    };
    // Activation: the atoms holding tokens < M, one 2 KB bulk copy each (group kg's two 64-k chunks), by thread 0.
    const int nat = int((M - tok0 + 7) / 8 < TOK / 8 ? (M - tok0 + 7) / 8 : TOK / 8);
    const unsigned char* xsrc = a.xh + ((tok0 >> 3) * KC + 2 * k0) * 1024;
    for (int j = 0; j < S; ++j)  // weights first: they do not depend on earlier kernels
      if (j < NG) issue_w(j, j);
    pdl_wait();
    for (int64_t kg = 0; kg < NG; ++kg) {
      const int s = int(kg % S);
      if (kg >= S) {
        mbar_wait(empty(s), uint32_t((kg / S + 1) & 1));  // the consumers are done with group kg - S
        issue_w(kg, s);
      }
      if (tid == 0) {
        mbar_expect_tx(full(s), unsigned(nat) * 2048u);
        for (int at = 0; at < nat; ++at)
          bulk_load(x_s + uint32_t(s * Lay::x_bytes + at * 2048), xsrc + (at * KC + 2 * kg) * 1024, 2048u, full(s));
      }
      cp_async_arrive(full(s));
    }
    cp_async_wait<0>();
  } else {
    // ---------------- consumers ----------------
#ifdef BONSAI_WGMMA
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
#endif
    pdl_wait();
    const int c = (tid >> 7) - 1, ct = tid & 127, warp = ct >> 5, lane = ct & 31, g = lane >> 2, q = lane & 3;
    // Block-local row of this thread in tile rt (wgmma D / A layout: warp w rows 16 w + g and + 8).
    auto lrow = [&](int rt) { return c * 64 * RB + rt * 64 + warp * 16 + g; };
    const __half* scales = reinterpret_cast<const __half*>(a.o[o].scales) + k0;
    int32_t sp[RB][2];  // scale offsets of this thread's rows (N x G < 2^31 for every shape of these packs)
#pragma unroll
    for (int rt = 0; rt < RB; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = row0 + lrow(rt) + 8 * h;
        sp[rt][h] = int32_t((row < N ? row : N - 1) * G);
      }
    float acc[RB][R];
#pragma unroll
    for (int rt = 0; rt < RB; ++rt)
#pragma unroll
      for (int i = 0; i < R; ++i) acc[rt][i] = 0.f;
#ifdef BONSAI_WGMMA
    // B descriptor of stage 0, k16 step 0: 128-byte swizzle, SBO = 2048 (8-token atoms of 2 KB), LBO unused (1).
    const uint64_t desc0 = uint64_t((x_s & 0x3FFFFu) >> 4) | (1ull << 16) | (uint64_t(2048 >> 4) << 32) | (1ull << 62);
    __half sc[RB][2];  // the scales of the next group, loaded a group ahead (their latency under a group's work)
#pragma unroll
    for (int rt = 0; rt < RB; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sc[rt][h] = scales[sp[rt][h]];
#pragma unroll
    for (int rt = 0; rt < RB; ++rt) pin(acc[rt]);  // zeroed before the first fence (C7515 otherwise)
    uint32_t magic;  // 0x64006400 (two fp16 1024s), opaque to the compiler so that dec2's lop3 takes it as a register
    asm volatile("mov.b32 %0, 0x64006400;" : "=r"(magic));
    uint32_t A[2][8][4];  // two operand sets: a unit's wgmmas read theirs while the next unit decodes into the other
    // One UNIT = one 64-row tile of one group: decode its A, issue its 8 wgmmas, then wait for the previous unit's.
    auto unit = [&](int64_t kg, auto rt_c, auto set_c) {
      constexpr int rt = decltype(rt_c)::value, set = decltype(set_c)::value;
      const int s = int(kg % S);
      if (rt == 0) mbar_wait(full(s), uint32_t((kg / S) & 1));
      const uint32_t* rw = reinterpret_cast<const uint32_t*>(base + Lay::raw_off + s * Lay::raw_bytes) + lrow(rt) * kHRawStride;
      const uint4 l0 = *reinterpret_cast<const uint4*>(rw), l1 = *reinterpret_cast<const uint4*>(rw + 4);
      const uint4 h0 = *reinterpret_cast<const uint4*>(rw + 8 * kHRawStride),
                  h1 = *reinterpret_cast<const uint4*>(rw + 8 * kHRawStride + 4);
      const uint32_t wl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
      const uint32_t wh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
      const __half2 dl = __half2half2(sc[rt][0]), dh = __half2half2(sc[rt][1]);
      if (kg + 1 < NG) sc[rt][0] = scales[sp[rt][0] + kg + 1], sc[rt][1] = scales[sp[rt][1] + kg + 1];
      const int sh = 2 * q;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const uint32_t xl = wl[t] >> sh, xh = wh[t] >> sh;
        A[set][t][0] = dec2(xl, dl, magic);
        A[set][t][1] = dec2(xh, dh, magic);
        A[set][t][2] = dec2(xl >> 8, dl, magic);
        A[set][t][3] = dec2(xh >> 8, dh, magic);
      }
      pin(A[set]);  // every operand computed before the fence: ptxas serialises wgmmas whose inputs are defined inside
                      // their pipeline stage (warning C7513)
      wg_fence();
      const uint64_t db = desc0 + uint64_t(uint32_t(s * Lay::x_bytes) >> 4);
#pragma unroll
      for (int t = 0; t < 8; ++t) wgmma_h(acc[rt], A[set][t], db + uint64_t(((t >> 2) * 1024 + (t & 3) * 32) >> 4));
      wg_commit();
      wg_wait<1>();  // the previous unit's wgmmas are done: its operands and (at a group's last tile) its stage are free
      pin(A[set ^ 1]);
      if (rt == 0 && kg > 0) mbar_arrive(empty(int((kg - 1) % S)));
    };
    using I0 = std::integral_constant<int, 0>;
    using I1 = std::integral_constant<int, 1>;
    if constexpr (RB == 2) {
      for (int64_t kg = 0; kg < NG; ++kg) unit(kg, I0{}, I0{}), unit(kg, I1{}, I1{});
    } else {
      int64_t kg = 0;  // pairs of groups, then an odd last one: every path alternates the operand sets (ptxas
                       // serialises the wgmmas if a path could decode into a set still in flight: C7513)
      for (; kg + 1 < NG; kg += 2) unit(kg, I0{}, I0{}), unit(kg + 1, I0{}, I1{});
      if (kg < NG) unit(kg, I0{}, I0{});
    }
    wg_wait<0>();
#pragma unroll
    for (int rt = 0; rt < RB; ++rt) pin(acc[rt]);
#else
    (void)sp;
    __trap();  // built without sm_90a: gemmh_supported() keeps the backend off this kernel
#endif
    if (split >= 0 && !fold_sum(reinterpret_cast<float(&)[RB * R]>(acc), a.part, a.cnt, split, kz, ksl, tid - 128))
      return;  // folded split: partials, then the tile's last block sums them
    float* y = a.o[o].y + (a.kt > 0 ? 0 : kz * a.part_stride);
#pragma unroll
    for (int rt = 0; rt < RB; ++rt)
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t row = row0 + lrow(rt) + (i & 2 ? 8 : 0);
        const int64_t tok = tok0 + 8 * (i >> 2) + 2 * q + (i & 1);
        if (row < N && tok < M) y[tok * N + row] = acc[rt][i];
      }
  }
}

struct HPick {
  const void* func;
  uint32_t smem;
  int tok, rows;
  double cost;  // relative time per MAC of this tile in steady state (below)
};
template <int TOK, int RB, int S>
HPick h_cfg(double cost) {
  static_assert(HLayout<TOK, RB, S>::bytes + 1024 <= 227 * 1024);
  return {reinterpret_cast<const void*>(&gemmh_kernel<TOK, RB, S>), uint32_t(1024 + HLayout<TOK, RB, S>::bytes), TOK,
          128 * RB, cost};
}
// The kernel instances (GemmHPlan::cfg), stages as deep as ~200 KB of shared memory allows. Their steady-state cost per
// MAC relative to 256 x 128 is a guess from the activation tile's L2 traffic per MAC (round 13 measured only 256 x 128
// against the others' whole shapes): 128-row or 64-token tiles read twice the activation or weight bytes per MAC.
// (512 x 32 measured slower than 256 x 32 on every M = 32 shape: 93.6 vs 75.4 us on gate+up; removed.)
constexpr int kHCfgs = 4;
HPick h_cfg_of(int cfg) {
  switch (cfg) {
    case 0: return h_cfg<32, 2, 10>(1.0);   // 256 x 32 (M <= 32)
    case 1: return h_cfg<64, 2, 7>(1.1);    // 256 x 64
    case 2: return h_cfg<128, 2, 5>(1.0);   // 256 x 128
    default: return h_cfg<128, 1, 5>(1.1);  // 128 x 128
  }
}

}  // namespace

GemmHPlan gemmh_plan(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int sms, int tile) {
  auto plan_of = [&](int cfg) {
    const HPick p = h_cfg_of(cfg);
    const int64_t B = gemm_blocks(outs, n_outs, M, p.rows, p.tok);
    const Gemm3Fold f = fold_plan(B, sms, K / 128, int64_t(p.rows) * p.tok);
    const double rounds = f.kt <= 1     ? double((B + sms - 1) / sms)
                          : f.nfull > 0 ? double(f.nfull / sms) + 1.0 / f.kt  // the last wave's tiles in kt slices
                                        : double((B * f.kt + sms - 1) / sms) / f.kt;  // every tile in kt slices
    // A split adds its partials' traffic and the last block's sum (round 13: 256 x 128 in 2 slices with a sum kernel
    // measured 214 us on gate+up M256 against 199 for 128 x 128 unsplit).
    return std::make_pair(GemmHPlan{cfg, f}, rounds * p.rows * p.tok * p.cost * (f.kt > 1 ? 1.1 : 1.0));
  };
  if (tile > 0) return plan_of(std::min(tile - 1, kHCfgs - 1)).first;
  if (M <= 32) return plan_of(0).first;
  auto best = plan_of(2);  // the tile with the fewest rounds of work (a partial last round costs a whole one)
  for (int cfg : {3, 1})
    if (const auto c = plan_of(cfg); c.second < best.second) best = c;
  return best.first;
}

int64_t gemmh_xh_bytes(int64_t M, int64_t K) { return (M + 7) / 8 * 8 * K * 2; }

Launch xh_pack_launch(const int8_t* xq, const float2* xds, int64_t M, int64_t K, int levels, void* xh) {
  XhPackArgs a{};
  a.xq = xq;
  a.xds = xds;
  a.xh = static_cast<unsigned char*>(xh);
  a.M = M;
  a.K = K;
  a.rows8 = (M + 7) / 8 * 8;
  a.levels = levels == 2 ? 2 : 1;
  const int64_t n = a.rows8 * (K / 16);
  return make_launch(reinterpret_cast<const void*>(&xh_pack_kernel), dim3(unsigned((n + 255) / 256)), dim3(256), 0, a);
}

void init_gemmh_attributes() {
  for (int cfg = 0; cfg < kHCfgs; ++cfg) {
    const HPick p = h_cfg_of(cfg);
    cudaFuncSetAttribute(p.func, cudaFuncAttributeMaxDynamicSharedMemorySize, int(p.smem));
  }
}

Launch gemmh_launch(const TernaryDev* outs, int n_outs, int64_t K, const void* xh, int64_t M, const GemmHPlan& plan,
                    int ks, int64_t part_stride, float* part, int32_t* cnt) {
  const HPick p = h_cfg_of(plan.cfg);
  GemmHArgs a{};
  const Gemm2Args g = gemm_args(outs, n_outs, K, nullptr, nullptr, M, ks, part_stride, true, p.rows);
  std::copy(std::begin(g.o), std::end(g.o), std::begin(a.o));
  a.xh = static_cast<const unsigned char*>(xh);
  a.K = K;
  a.M = M;
  a.part_stride = part_stride;
  a.n_outs = n_outs;
  a.ks = ks;
  if (part) {  // folded split
    a.part = part;
    a.cnt = cnt;
    a.nfull = plan.fold.nfull;
    a.rb = gemm_row_blocks(outs, n_outs, p.rows);
    a.kt = plan.fold.kt;
    const Gemm3Fold& f = plan.fold;
    return make_launch(p.func, dim3(unsigned(f.nfull + (f.tiles - f.nfull) * f.kt)), dim3(kHThreads), p.smem,
                       a);
  }
  const dim3 grid{unsigned(gemm_row_blocks(outs, n_outs, p.rows)), unsigned((M + p.tok - 1) / p.tok), unsigned(ks)};
  return make_launch(p.func, grid, dim3(kHThreads), p.smem, a);
}

}  // namespace bonsai::cuda
