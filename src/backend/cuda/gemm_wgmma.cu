// Ternary GEMM v2 (BONSAI_CUDA_GEMM=2): Hopper warpgroup MMA (wgmma, sm_90a) for prefill chunks and batched
// decode. Same inputs and semantics as gemm_kernel (ternary.cu): canonical weight words + fp16 group scales,
// the activation as 1 (q8) or 2 (q16) int8 digit planes in the within-16 transposed order, y [M, N] fp32
// = sum over 128-groups of d_w[row, g] * u_x[token, g] * (254 I0 + I1) (q16) or d_w u_x I0 (q8), the
// integer dots exact in int32 and the per-group scaling in fp32.
//
// Why a second kernel: gemm_kernel (mma.sync m16n8k32) spends ~11 instructions per mma on per-warp A
// decoding, fragment loads and scaling (ncu, docs/cuda-kernels.md round 4). Here
//   - the block's weight rows of a group (64 per warpgroup, 2 warpgroups by default) are decoded ONCE from
//     2-bit codes to int8 into shared memory (each thread decodes the 16 bytes it copied itself), in the
//     128-byte-swizzled K-major tile layout wgmma reads (Stage2 below);
//   - each warpgroup multiplies its 64 rows with the group's activation planes, straight from shared
//     memory, by one wgmma m64nNk32 per k-step and plane (N = half the token tile);
//   - the token tile is taken in two halves with their own accumulators: the first half is scaled while
//     the second half's wgmmas run, the next group is decoded under them too, and the second half is
//     scaled under the next group's first half;
//   - q16: the two planes get separate int32 accumulators (no wait between them), combined as 254 I0 + I1
//     at the scaling (exact: |254 I0 + I1| <= 128 * 32385 < 2^22).
// Loads: cp.async ring of S stages per 128-group: raw words (4 KB per 128 rows), the digit planes of TOK
// tokens and their units; one __syncthreads per group. Measured (H200, round 5): faster than v1 above 64
// tokens and for products of <= 16,384 rows; the default from round 5 to round 7, when the warp-specialised
// v3 (gemm_ws.cu) replaced it (faster at every measured shape); now selected only by BONSAI_CUDA_GEMM=2.
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ternary_dot.cuh"
#include "backend/cuda/wgmma.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kRawStride = 12;    // words per row of a raw stage (8 used): conflict-free 16 B reads

// One 128-group in flight. X and the decoded weights are K-major wgmma operand tiles, 8-row atoms of 1024 B
// (atom i = rows 8i..8i+7 at 1024 i), in one of two layouts of the 16 B chunk c (k bytes 16c..16c+15) of
// row r = 8i + j:
//   swizzled (swz = 1, default): at 1024 i + 128 j + 16 (c ^ j) (128-byte swizzle: each row one 128 B line,
//     its chunks XOR-permuted by the row, so any 8 rows' chunk c lie in 8 different bank quads);
//   no swizzle (swz = 0, BONSAI_CUDA_GEMM2_SWIZZLE=0): core matrices (8 rows x 16 B) at 1024 i + 128 c, row
//     j at + 16 j (descriptor LBO = 128 along K, SBO = 1024 along rows). Correct but slower (round 5:
//     gate+up M256 559 vs 422 us, down M256 269 vs 204): likely bank conflicts in wgmma's operand reads.
// Both are written conflict-free (8 consecutive threads fill 8 rows of one chunk column).
template <int TOK, int L, int ROWS>
struct Stage2 {
  int8_t X[L][TOK * 128];             // [plane][TOK / 8 atoms][1024 B]: digit plane l of the group's tokens
  uint32_t raw[ROWS * kRawStride];    // [row][kRawStride] canonical words of the group (8 used)
};                                    // (a multiple of 1024 B: every X stays atom-aligned)

#ifdef BONSAI_WGMMA
// wgmma m64nNk32 s32 += s8 x s8, both operands from shared memory (K-major), for N = 16 / 32 / 64 (N / 2
// accumulator registers per thread). acc = 0: D = A B (the group's first k-step), else D += A B.
__device__ __forceinline__ void wgmma_s8(int (&d)[8], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
      : "l"(da), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_s8(int (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_s8(int (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
#endif


// TOK tokens per block (32, 64 or 128; two halves of TOK / 2), L digit planes, S stages (>= 3: the loads of
// group kg + 1 were issued one iteration before they are decoded), MINB blocks per SM (register budget),
// WGS warpgroups (64 weight rows each) per block.
template <int TOK, int L, int S, int MINB, int WGS>
__global__ __launch_bounds__(WGS * 128, MINB) void gemm2_kernel(const Gemm2Args a) {
  static_assert(S >= 3 && (TOK == 32 || TOK == 64 || TOK == 128) && (WGS == 1 || WGS == 2));
  constexpr int kRows = 64 * WGS, kThreads = 128 * WGS;
  static_assert(sizeof(Stage2<TOK, L, kRows>) % 1024 == 0);
  constexpr int NH = TOK / 2;  // tokens per half = the wgmma's N
  constexpr int R = NH / 2;    // int32 accumulator registers per thread per half and plane (64 x NH / 128)
  extern __shared__ __align__(128) unsigned char g2_smem[];
  // Swizzle atoms need 1024 B alignment: the base is rounded up (the launch adds 1 KB).
  unsigned char* base = g2_smem + ((1024 - (unsigned(__cvta_generic_to_shared(g2_smem)) & 1023)) & 1023);
  int8_t* dec = reinterpret_cast<int8_t*>(base);  // [2][kRows * 128] decoded weights of groups kg, kg + 1 (tiles)
  auto* st = reinterpret_cast<Stage2<TOK, L, kRows>*>(base + 2 * kRows * 128);  // [S]
  float* units = reinterpret_cast<float*>(st + S);  // [S][TOK] activation unit u per token (0 past M)

  int o = 0;
#pragma unroll
  for (int i = 1; i < kMaxOuts; ++i)
    if (i < a.n_outs && int64_t(blockIdx.x) >= a.o[i].b0) o = i;
  const uint32_t* words = a.o[o].words;
  const __half* scales = reinterpret_cast<const __half*>(a.o[o].scales);
  const int64_t N = a.o[o].N, K = a.K, M = a.M, KW = K / 16, G = K / 128, C = K / 64;
  const int64_t kz = blockIdx.z, k0 = G * kz / a.ks, NG = G * (kz + 1) / a.ks - k0;
  float* y = a.o[o].y + kz * a.part_stride;
  const int64_t row0 = (int64_t(blockIdx.x) - a.o[o].b0) * kRows;
  const int64_t tok0 = int64_t(blockIdx.y) * TOK;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;

  // This thread's 16 B of every group's weights: row wr = 8 (tid / 16) + tid % 8, words 4 wh..4 wh + 3;
  // it decodes them itself (its own cp.async wait suffices) into core matrices (wr / 8, 4 wh + i): the 8
  // threads of a phase write 128 contiguous bytes. Warpgroup w copies and decodes its own 64 rows.
  const int wr = (tid >> 4) * 8 + (tid & 7), wh = (tid >> 3) & 1;
  const int64_t wrow = row0 + wr;
  const uint32_t* wsrc = words + (wrow < N ? wrow : N - 1) * KW + k0 * 8 + wh * 4;
  const int wbytes = wrow < N ? 16 : 0;
  const int swz = a.swz;
  int dec_off[4];  // this thread's 4 chunks (row wr, chunk 4 wh + i) in the decoded tile
#pragma unroll
  for (int i = 0; i < 4; ++i) dec_off[i] = tile_off(wr, 4 * wh + i, swz);

  auto issue_w = [&](int64_t kg, int s) { cp_async16(&st[s].raw[wr * kRawStride + wh * 4], wsrc + kg * 8, wbytes); };
  auto issue_x = [&](int64_t kg, int s) {
    // id -> (plane, token group, k chunk c, token % 8): 8 consecutive threads fill one core matrix.
#pragma unroll
    for (int id = tid; id < L * TOK * 8; id += kThreads) {
      const int t8 = id & 7, c = (id >> 3) & 7, tg = (id >> 6) % (TOK / 8), l = (id >> 6) / (TOK / 8);
      const int64_t tok = tok0 + tg * 8 + t8;
      const int8_t* src = a.xq + ((tok < M ? tok : M - 1) * L + l) * K + (k0 + kg) * 128 + c * 16;
      cp_async16(&st[s].X[l][tile_off(tg * 8 + t8, c, swz)], src, tok < M ? 16 : 0);
    }
    for (int t = tid; t < TOK; t += kThreads) {
      const int64_t tok = tok0 + t;
      cp_async4(&units[s * TOK + t], &a.xds[(tok < M ? tok : M - 1) * C + (k0 + kg) * 2].x, tok < M ? 4 : 0);
    }
  };
  // Word j of a row holds element 16 j + 4 b + i at bits 8 b + 2 i; the transposed activation holds it at
  // position 16 j + 4 i + b, so decode4(w >> 2 i) is the 4 bytes at positions 16 j + 4 i .. + 3.
  auto decode = [&](int s, int b) {
    const uint4 w4 = *reinterpret_cast<const uint4*>(&st[s].raw[wr * kRawStride + wh * 4]);
    int8_t* d = dec + b * kRows * 128;
    const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<uint4*>(d + dec_off[i]) = make_uint4(decode4(w[i]), decode4(w[i] >> 2), decode4(w[i] >> 4), decode4(w[i] >> 6));
  };

  // Rows of this thread's accumulators (wgmma D layout: warp w of the warpgroup rows 16 w + g and + 8;
  // register 4 j + i of a half: column 8 j + 2 q + (i & 1), row + 8 when i >= 2).
  const int64_t rlo = row0 + wg * 64 + warp * 16 + g, rhi = rlo + 8;
  const __half* slo = scales + (rlo < N ? rlo : N - 1) * G + k0;
  const __half* shi = scales + (rhi < N ? rhi : N - 1) * G + k0;

  int acc[2][L][R];  // [half][plane][register]
  float f[2][R];     // [half][register] fp32 sums over groups
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < R; ++i) {
      f[h][i] = 0.f;
#pragma unroll
      for (int l = 0; l < L; ++l) acc[h][l][i] = 0;
    }

  // f += d_w u_x (254 I0 + I1) for one half (R = NH / 2 registers).
  auto scale_half = [&](const int (&ac)[L][R], float (&fh)[R], const float* unit, float2 dw) {
    scale_group<L, R, 0>(ac, fh, unit, dw, q);
  };

#ifdef BONSAI_WGMMA
  const uint32_t dec_s = unsigned(__cvta_generic_to_shared(dec)) + wg * 8 * kGroupRow;
  const uint32_t st_s = unsigned(__cvta_generic_to_shared(st));
  // One half's 4 k-steps x L planes of wgmma on group buffers (decoded b, stage s); one commit group.
  auto mma_half = [&](int (&ac)[L][R], int b, int s, int h) {
#pragma unroll
    for (int l = 0; l < L; ++l) pin(ac[l]);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint64_t da = smem_desc(dec_s + b * kRows * 128, ks, swz);
#pragma unroll
      for (int l = 0; l < L; ++l) {
        const uint32_t xb = st_s + uint32_t(s * sizeof(Stage2<TOK, L, kRows>)) + l * TOK * 128 + h * (NH / 8) * kGroupRow;
        wgmma_s8(ac[l], da, smem_desc(xb, ks, swz), ks);
      }
    }
    wg_commit();
  };
  auto done = [&](int (&ac)[L][R]) {
#pragma unroll
    for (int l = 0; l < L; ++l) pin(ac[l]);
  };

  pdl_trigger();
  for (int j = 0; j < S - 1; ++j)  // weights first: they do not depend on earlier kernels
    if (j < NG) issue_w(j, j);
  pdl_wait();
  for (int j = 0; j < S - 1; ++j) {
    if (j < NG) issue_x(j, j);
    cp_async_commit();  // commit group j = the loads of group j (the first also holds the early weights)
  }
  cp_async_wait<S - 2>();
  if (NG > 0) decode(0, 0);
  fence_async_smem();
  __syncthreads();

  // Per group: first half's wgmmas; the previous group's second half scaled under them; second half's
  // wgmmas; first half scaled and the next group decoded under those. No wgmma is in flight across the
  // loop's back edge: ptxas (13.0) serialises every wgmma (C7514) when one is, so the second half is
  // waited for at the end of the iteration and scaled at the start of the next.
  auto dw_of = [&](int64_t kg) { return make_float2(__half2float(slo[kg]), __half2float(shi[kg])); };
  float2 dw = NG > 0 ? dw_of(0) : make_float2(0.f, 0.f), dw_prev = dw;
  for (int64_t kg = 0; kg < NG; ++kg) {
    const int s = int(kg % S), b = int(kg & 1);
    const float2 dw_next = kg + 1 < NG ? dw_of(kg + 1) : dw;  // loaded a group early
    mma_half(acc[0], b, s, 0);
    if (kg > 0) scale_half(acc[1], f[1], units + ((kg - 1) % S) * TOK + NH, dw_prev);
    mma_half(acc[1], b, s, 1);
    wg_wait<1>();
    done(acc[0]);
    scale_half(acc[0], f[0], units + s * TOK, dw);
    // The next group's weights: buffer b ^ 1 was last read by this warpgroup's wgmmas of group kg - 1,
    // complete since the previous iteration's end.
    if (kg + 1 < NG) {
      cp_async_wait<S - 3>();  // commit groups 0 .. kg + S - 2 exist; group kg + 1 has landed
      decode(int((kg + 1) % S), b ^ 1);
    }
    fence_async_smem();
    __syncthreads();  // group kg + 1 (planes, units, decoded weights) visible; group kg - 1's stage free
    if (kg + S - 1 < NG) {
      const int sn = int((kg + S - 1) % S);
      issue_w(kg + S - 1, sn);
      issue_x(kg + S - 1, sn);
    }
    cp_async_commit();
    wg_wait<0>();
    done(acc[1]);
    dw_prev = dw;
    dw = dw_next;
  }
  if (NG > 0) scale_half(acc[1], f[1], units + ((NG - 1) % S) * TOK + NH, dw_prev);
#else
  (void)NG, (void)slo, (void)shi;
  pdl_trigger();
  pdl_wait();
  __trap();  // built without sm_90a: gemm2_supported() keeps the backend off this kernel
#endif

#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = i & 2 ? rhi : rlo;
      const int64_t tok = tok0 + h * NH + 8 * (i >> 2) + 2 * q + (i & 1);
      if (row < N && tok < M) y[tok * N + row] = f[h][i];
    }
}

// Configurations (ptxas, nvcc 13.0, q16): 2 warpgroups: TOK 128 237 registers / 190 KB shared -> 1 block
// per SM, TOK 64 149 / 124 KB -> 1, TOK 32 101 / 89 KB -> 2; 1 warpgroup (64 rows; M > 64 in 64-token
// tiles): TOK 64 S 3 -> 3 blocks per SM (74 KB), TOK 32 S 3 -> 4 (50 KB). Independent blocks on an SM hide
// each other's per-group latency chain (wait, scale, decode, barrier), which bound the 2-warpgroup form.
struct Gemm2Pick {
  const void* func;
  uint32_t smem;
  int tok, rows, per_sm;
};
template <int TOK, int L, int S, int MINB, int WGS>
Gemm2Pick gemm2_cfg() {
  return {reinterpret_cast<const void*>(&gemm2_kernel<TOK, L, S, MINB, WGS>),
          uint32_t(1024 + 2 * 64 * WGS * 128 + S * (sizeof(Stage2<TOK, L, 64 * WGS>) + TOK * sizeof(float))), TOK,
          64 * WGS, MINB};
}
template <int L>
Gemm2Pick gemm2_pick_l(int64_t M, int wgs) {
  if (wgs == 2) return M <= 32 ? gemm2_cfg<32, L, 4, 2, 2>() : M <= 64 ? gemm2_cfg<64, L, 4, 1, 2>() : gemm2_cfg<128, L, 4, 1, 2>();
  return M <= 32 ? gemm2_cfg<32, L, 3, 4, 1>() : gemm2_cfg<64, L, 3, 3, 1>();
}
Gemm2Pick gemm2_pick(int levels, int64_t M, int wgs) {
  return levels == 2 ? gemm2_pick_l<2>(M, wgs) : gemm2_pick_l<1>(M, wgs);
}

}  // namespace

// The kernel is built for sm_90a (CMAKE_CUDA_ARCHITECTURES 90a, the default); elsewhere its body traps.
bool gemm2_supported(int cc_major, int cc_minor) { return cc_major == 9 && cc_minor == 0; }

void init_gemm2_attributes() {
  for (int lv : {1, 2})
    for (int wgs : {1, 2})
      for (int64_t m : {32, 64, 128}) {
        const Gemm2Pick p = gemm2_pick(lv, m, wgs);
        cudaFuncSetAttribute(p.func, cudaFuncAttributeMaxDynamicSharedMemorySize, int(p.smem));
      }
}

int gemm2_ksplit(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int wgs) {
  // As gemm_ksplit's wave-aware rule (wave_ksplit, wgmma.cuh) with v2's block slots.
  const Gemm2Pick p = gemm2_pick(levels == 2 ? 2 : 1, M, wgs);
  return wave_ksplit(gemm_blocks(outs, n_outs, M, p.rows, p.tok), int64_t(sms) * p.per_sm, K / 128);
}

Launch gemm2_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                    int levels, int wgs, int ks, int64_t part_stride, bool swizzle) {
  const Gemm2Pick p = gemm2_pick(levels == 2 ? 2 : 1, M, wgs);
  const Gemm2Args a = gemm_args(outs, n_outs, K, xq, xds, M, ks, part_stride, swizzle, p.rows);
  const dim3 grid{unsigned(gemm_row_blocks(outs, n_outs, p.rows)), unsigned((M + p.tok - 1) / p.tok), unsigned(ks)};
  return make_launch(p.func, grid, dim3(unsigned(2 * p.rows)), p.smem, a);
}

}  // namespace bonsai::cuda
