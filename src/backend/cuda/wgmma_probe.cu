// Round 20: the tensor-core ceiling of GEMM v3's consumer loop, with no producer and no memory traffic (a probe, not
// a product kernel). One block per SM of v3's shape (a 128-thread warpgroup that only gives its registers back, two
// consumer warpgroups of 64 rows x 128 tokens x 2 digit planes), every group's operands read from ONE resident stage,
// so the time is the consumers' alone. Modes (WgmmaProbeMode): the bare wgmma stream from registers (RS) and from
// shared memory (SS), then v3's loop piece by piece (decode, turn-taking, scaling and its int -> float, the proxy fence,
// the stage releases) to see what each costs against the bare stream. Per group and consumer: 8 x m64n128k32 = 4.19 M
// int8 ops (2 per MAC).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/ternary_dot.cuh"
#include "backend/cuda/wgmma.cuh"

namespace bonsai::cuda {
namespace {

struct WgmmaProbeArgs {
  float* sink;     // [blocks][256]: each consumer thread's sum (keeps the work live)
  int32_t groups;  // 128-groups per consumer
  int32_t pad_;
};

constexpr int kProbeTok = 128;
// Shared memory (from a 1024-aligned base): B planes [2][128 tokens][128 B] (swizzled), A tiles for SS [2][64][128 B],
// raw words [128 rows][12] u32 (v3's stride), scales fp16 [128 rows].
constexpr int kProbeB = 2 * kProbeTok * 128, kProbeA = 2 * 64 * 128, kProbeRaw = 128 * 12 * 4;
constexpr uint32_t kProbeSmem = 1024 + kProbeB + kProbeA + kProbeRaw + 256;

#ifdef BONSAI_WGMMA
__device__ __forceinline__ void wgmma_ss(int (&d)[64], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}
#endif

template <int MODE>
__global__ __launch_bounds__(384, 1) void wgmma_probe_kernel(const WgmmaProbeArgs a) {
  extern __shared__ __align__(128) unsigned char pr_smem[];
  unsigned char* base = pr_smem + ((1024 - (smem_u32(pr_smem) & 1023)) & 1023);
  const int tid = threadIdx.x;
  // Arbitrary operand bytes (the tensor pipe's time does not depend on them); scales 1.0.
  for (int i = tid; i < (kProbeB + kProbeA + kProbeRaw) / 4; i += 384)
    reinterpret_cast<uint32_t*>(base)[i] = 0x01FF0102u * uint32_t(i + 1);
  __half* scales = reinterpret_cast<__half*>(base + kProbeB + kProbeA + kProbeRaw);
  if (tid < 128) scales[tid] = __float2half(1.f);
  __syncthreads();
#ifdef BONSAI_WGMMA
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = (tid >> 7) - 1, ct = tid & 127, warp = ct >> 5, lane = ct & 31, g = lane >> 2, q = lane & 3;
  const uint32_t b_s = smem_u32(base), a_s = b_s + kProbeB + uint32_t(c) * 64 * 128;
  const uint32_t* raw = reinterpret_cast<const uint32_t*>(base + kProbeB + kProbeA);
  const int wrow = c * 64 + warp * 16 + g;
  const float2 dw = make_float2(__half2float(scales[wrow]), __half2float(scales[wrow + 8]));
  const uint64_t desc0 = smem_desc(b_s, 0, 1), adesc0 = smem_desc(a_s, 0, 1);
  const int my_turn = c == 0 ? 1 : 2, next_turn = c == 0 ? 2 : 1;
  int acc[2][64];
  float f[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) f[i] = 0.f, acc[0][i] = acc[1][i] = 0;
  uint32_t af[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) af[ks][i] = 0x01000101u << (ks + i);
  // An mbarrier nobody waits on, its phase completed by every group's arrivals (the arrive modes).
  __shared__ __align__(8) uint64_t arrive_bar;
  constexpr bool kArrive = MODE == kWgmmaProbeV3Arrive || MODE == kWgmmaProbeV3WarpArrive;
  if (kArrive && tid == 128) mbar_init(&arrive_bar, MODE == kWgmmaProbeV3Arrive ? 256 : 8);
  named_sync(3, 256);
  constexpr bool kDecode = MODE >= kWgmmaProbeV3, kTurns = MODE == kWgmmaProbeV3 || MODE >= kWgmmaProbeV3Fence,
                 kScale = MODE != kWgmmaProbeV3NoScale && MODE >= kWgmmaProbeV3;
  for (int kg = 0; kg < a.groups; ++kg) {
    if constexpr (MODE == kWgmmaProbeV3Fence) fence_async_smem();
    if constexpr (kDecode) v3_fragments(&raw[wrow * 12], 12, q, af);  // v3's A fragments from the raw words
    if constexpr (MODE == kWgmmaProbeV3Pinned)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) pin(af[ks]);
    if constexpr (kTurns)
      if (c == 1 || kg > 0) named_sync(my_turn, 256);
#pragma unroll
    for (int l = 0; l < 2; ++l) pin(acc[l]);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int l = 0; l < 2; ++l) {
        const uint64_t db = desc0 + uint64_t((l * kProbeTok * 128 + 32 * ks) >> 4);
        if constexpr (MODE == kWgmmaProbeSS) wgmma_ss(acc[l], adesc0 + uint64_t((32 * ks) >> 4), db, ks);
        else wgmma_rs(acc[l], af[ks], db, ks);
      }
    wg_commit();
    if constexpr (kTurns)
      if (c == 0 || kg + 1 < a.groups) named_arrive(next_turn, 256);
    wg_wait<0>();
#pragma unroll
    for (int l = 0; l < 2; ++l) pin(acc[l]);
    if constexpr (kScale) {
      constexpr int kCvt = MODE == kWgmmaProbeV3Mant ? 0 : MODE == kWgmmaProbeV3Split ? 2 : 1;
      scale_group<2, 64, kCvt, true>(acc, f, nullptr, dw, q);
    } else if (kg + 1 == a.groups) {  // the accumulators once, so the stream is not dead code
#pragma unroll
      for (int i = 0; i < 64; ++i) f[i] += float(acc[0][i] + acc[1][i]);
    }
    if constexpr (MODE == kWgmmaProbeV3Arrive) mbar_arrive(&arrive_bar);
    if constexpr (MODE == kWgmmaProbeV3WarpArrive) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&arrive_bar);
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) pin(af[ks]);
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += f[i];
  a.sink[blockIdx.x * 256 + (tid - 128)] = s;
#else
  __trap();  // built without sm_90a
#endif
}

template <int MODE>
const void* probe_fn() {
  return reinterpret_cast<const void*>(&wgmma_probe_kernel<MODE>);
}
const void* probe_kernel(int mode) {
  switch (mode) {
    case kWgmmaProbeRS: return probe_fn<kWgmmaProbeRS>();
    case kWgmmaProbeSS: return probe_fn<kWgmmaProbeSS>();
    case kWgmmaProbeV3: return probe_fn<kWgmmaProbeV3>();
    case kWgmmaProbeV3NoTurns: return probe_fn<kWgmmaProbeV3NoTurns>();
    case kWgmmaProbeV3NoScale: return probe_fn<kWgmmaProbeV3NoScale>();
    case kWgmmaProbeV3Fence: return probe_fn<kWgmmaProbeV3Fence>();
    case kWgmmaProbeV3Pinned: return probe_fn<kWgmmaProbeV3Pinned>();
    case kWgmmaProbeV3Mant: return probe_fn<kWgmmaProbeV3Mant>();
    case kWgmmaProbeV3Split: return probe_fn<kWgmmaProbeV3Split>();
    case kWgmmaProbeV3Arrive: return probe_fn<kWgmmaProbeV3Arrive>();
    default: return probe_fn<kWgmmaProbeV3WarpArrive>();
  }
}

}  // namespace

Launch wgmma_probe_launch(int mode, float* sink, int blocks, int groups) {
  return make_launch(probe_kernel(mode), dim3(unsigned(blocks)), dim3(384), kProbeSmem,
                     WgmmaProbeArgs{sink, groups, 0});
}

void init_wgmma_probe_attributes() {
  for (int m = 0; m < kWgmmaProbeModes; ++m)
    if (cudaFuncSetAttribute(probe_kernel(m), cudaFuncAttributeMaxDynamicSharedMemorySize, int(kProbeSmem)) !=
        cudaSuccess)
      (void)cudaGetLastError();  // no device here (host-only tests): the launch itself would report it
}

}  // namespace bonsai::cuda
