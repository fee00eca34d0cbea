// Pieces shared by the two wgmma GEMMs (gemm_wgmma.cu = v2, gemm_ws.cu = v3; nvcc only) and v3's ceiling probe
// (wgmma_probe.cu): their argument struct, the 128-byte swizzled K-major operand tile, the shared-memory descriptor,
// the wgmma fences and issue (A from registers), the named barriers and the exact int -> float conversion of the
// per-group scaling.
#pragma once
#include <algorithm>
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

struct Gemm2Out {
  const uint32_t* words;   // [N, K/16] canonical words
  const uint16_t* scales;  // [N, K/128] fp16
  float* y;                // [M, N] (split-K: the slice's partial, + blockIdx.z * part_stride)
  int64_t N;
  int64_t b0;  // first block (grid.x) of this output
};
struct Gemm2Args {
  Gemm2Out o[kMaxOuts];
  const int8_t* xq;    // [M, L, K] digit planes
  const float2* xds;   // [M, K/64] {unit, digit sum}; only the unit is read
  int64_t K, M, part_stride;
  int32_t n_outs, ks;  // outputs; K slices (grid.z)
  int32_t swz, pad;    // 1: operand tiles in the 128-byte swizzled layout (v2's default; v3 always), 0: no swizzle
};

constexpr int kCore = 128;       // bytes of one core matrix (8 rows x 16 B)
constexpr int kGroupRow = 1024;  // bytes of 8 rows x one 128-group (8 core matrices along K)

// Byte offset of 16 B chunk c (k bytes 16c..16c+15 of a 128-group) of row `row` in a K-major operand tile of
// 8-row atoms (atom i = rows 8i..8i+7 at 1024 i), row j = row % 8 of its atom:
//   swizzled (swz = 1): at 1024 i + 128 j + 16 (c ^ j) (128-byte swizzle: each row one 128 B line, its chunks
//     XOR-permuted by the row, so any 8 rows' chunk c lie in 8 different bank quads);
//   no swizzle (swz = 0): core matrices (8 rows x 16 B) at 1024 i + 128 c, row j at + 16 j.
__device__ __forceinline__ int tile_off(int row, int c, int swz) {
  const int j = row & 7;
  return (row >> 3) * kGroupRow + (swz ? j * 128 + ((c ^ j) << 4) : c * kCore + j * 16);
}

// Exact int -> float for |c| < 2^22 by the mantissa of 1.5 * 2^23 (two full-rate ops; I2F is quarter rate).
__device__ __forceinline__ float i2f22(int c) { return __int_as_float(c + 0x4B400000) - 12582912.f; }

// One group's scaling of a wgmma accumulator fragment (R registers: token pairs 8 j + 2 q, + 1 of rows g and
// g + 8): f += d_w u_x (254 I0 + I1) (q16; d_w u_x I0 for q8), with dw = the two rows' d, unit = the group's
// token units. CVT, the int -> float (the same value every way): 1 = I2FP.F32.S32, 0 = i2f22 (IADD + FADD), 2 = half
// of the outputs each way (wgmma_probe.cu's kWgmmaProbeV3Split only: round 20 measured it, and 0, slower than 1 in
// v3's loop, 1,252 / 1,243 vs 1,400 TOP/s: the scaling is bound by its instruction count, not by I2FP's pipe).
// RU: the units are per token (applied once after the last group): f += d_w (254 I0 + I1), unit unread.
template <int L, int R, int CVT, bool RU = false>
__device__ __forceinline__ void scale_group(const int (&ac)[L][R], float (&f)[R], const float* unit, float2 dw, int q) {
#pragma unroll
  for (int j = 0; j < R / 4; ++j) {
    const float2 u = RU ? make_float2(1.f, 1.f) : *reinterpret_cast<const float2*>(unit + 8 * j + 2 * q);
    const float sc[4] = {dw.x * u.x, dw.x * u.y, dw.y * u.x, dw.y * u.y};  // RU: x * 1 folds to x (exact)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int c = ac[0][4 * j + i];
      if constexpr (L == 2) c = c * 254 + ac[1][4 * j + i];
      const bool i2f = CVT == 1 || (CVT == 2 && (i & 1));
      f[4 * j + i] = fmaf(sc[i], i2f ? float(c) : i2f22(c), f[4 * j + i]);
    }
  }
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BONSAI_WGMMA 1
#endif

#ifdef BONSAI_WGMMA
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Generic-proxy writes (cp.async, st.shared) made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif

// Named barriers (ids 1..15; 0 is __syncthreads) over n threads: the consumers' turn-taking.
__device__ __forceinline__ void named_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

#ifdef BONSAI_WGMMA
// wgmma m64nNk32 s32 += s8 x s8, A (64 x 32 weights) from registers, B (N x 32 activation digits) from
// shared memory (K-major), N = 32 / 64 / 128 / 256 (N / 2 accumulators per thread). acc = 0: D = A B.
// A fragment (as mma.sync m16n8k32): warp w of the warpgroup rows 16 w + g (a[0], a[2]) and + 8 (a[1],
// a[3]); a[0], a[1] k bytes 4q..4q+3, a[2], a[3] k bytes 16+4q..16+4q+3 (g = lane / 4, q = lane % 4).
__device__ __forceinline__ void wgmma_rs(int (&d)[16], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_rs(int (&d)[32], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_rs(int (&d)[64], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_rs(int (&d)[128], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]), "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]), "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]), "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]), "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]), "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]), "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
#endif

// Keeps the compiler from moving accumulator reads across a wgmma wait (or writes across an issue), and keeps register
// operands live (in their registers) until the wait that retires the wgmmas reading them.
template <int R>
__device__ __forceinline__ void pin(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void pin(uint32_t (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R, int C>
__device__ __forceinline__ void pin(uint32_t (&d)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i) pin(d[i]);
}

// K-major operand descriptor at k-step ks (32 bytes) of a tile starting at addr (1024-aligned): swizzled:
// start + 32 ks inside the 128 B rows (the hardware applies the XOR to the address bits), SBO = 1024, LBO
// unused (1), mode 1 = 128 B swizzle; no swizzle: start + 256 ks (two core matrices), LBO 128, SBO 1024.
[[maybe_unused]] __device__ __forceinline__ uint64_t smem_desc(uint32_t addr, int ks, int swz) {
  const uint32_t start = addr + (swz ? 32u : 256u) * uint32_t(ks);
  const uint64_t lbo = swz ? 1u : (kCore >> 4), sbo = kGroupRow >> 4;
  return uint64_t((start & 0x3FFFFu) >> 4) | (lbo << 16) | (sbo << 32) | (uint64_t(swz ? 1 : 0) << 62);
}

// K slices for a GEMM of `blocks` blocks on `slots` resident block slots over G 128-groups: time ~ rounds of
// resident blocks, ceil(blocks * ks / slots) / ks; a split is taken when it saves >= 15 % (it adds the
// ordered sum of the slices); slices of >= 16 groups.
inline int wave_ksplit(int64_t blocks, int64_t slots, int64_t G) {
  if (G < 32) return 1;
  int64_t best = 1;
  double best_t = double((blocks + slots - 1) / slots);
  for (int64_t ks = 2; ks <= std::min<int64_t>(8, G / 16); ++ks) {
    const double t = double((blocks * ks + slots - 1) / slots) / double(ks);
    if (t < 0.85 * best_t) best = ks, best_t = t;
  }
  return int(best);
}

// Blocks of a v2 / v3 launch: per weight set, blocks of `rows` weight rows (grid.x, one set after another),
// times the token tiles of `tok` tokens (grid.y).
inline int64_t gemm_row_blocks(const TernaryDev* outs, int n_outs, int64_t rows) {
  int64_t b = 0;
  for (int i = 0; i < n_outs; ++i) b += (outs[i].N + rows - 1) / rows;
  return b;
}
inline int64_t gemm_blocks(const TernaryDev* outs, int n_outs, int64_t M, int64_t rows, int64_t tok) {
  return gemm_row_blocks(outs, n_outs, rows) * ((M + tok - 1) / tok);
}

// The arguments of a v2 / v3 launch whose blocks cover `rows` weight rows each (every set's first block b0).
inline Gemm2Args gemm_args(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds,
                           int64_t M, int ks, int64_t part_stride, bool swizzle, int64_t rows) {
  Gemm2Args a{};
  a.xq = xq;
  a.xds = xds;
  a.K = K;
  a.M = M;
  a.part_stride = part_stride;
  a.n_outs = n_outs;
  a.ks = ks;
  a.swz = swizzle ? 1 : 0;
  int64_t b0 = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, b0};
    b0 += (outs[i].N + rows - 1) / rows;
  }
  return a;
}

}  // namespace bonsai::cuda
