// The activation site of decode rows (round 11): one 128-thread block per 1024-element block of a row, 8 elements per
// thread (warp_site.cuh's slot functions): strides 1-4 in the thread, 8-128 by shuffles, 256 and 512 in one exchange
// through 4 KB of shared memory (one barrier). site_kernel spends a 1024-thread block per tile with a barrier per
// stride of 32 and up; on the decode chain its silu * up site cost ~5.4 us and the gated norm's ~4.3 us (round 10's
// leave-one-out), the latency of those barrier chains. Same operations in the same order as site_kernel (pre-op,
// signs, a + b / a - b per stride, * norm, the quantiser), so xq / xds / dst / pre_out are its own bit for bit for the
// elementwise pre-ops; the gated norm sums its squares in another order. AddNorm rows keep the cluster site (their
// norm needs the whole row), prefill rows the warp site.
#include <cooperative_groups.h>

#include "backend/cuda/block_trace.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/warp_site.cuh"

namespace bonsai::cuda {
namespace {

struct SiteRowArgs {
  SitePrologue s;  // row 0's operands; pre_out: the pre-op's result [rows, ld] or null
  float* dst;      // [rows, K] the fp32 site, or null
  int8_t* xq;      // [rows, LV, K]
  float2* xds;     // [rows, K/64]
  int64_t ld, K;   // row stride of src / src2 / pre_out; row length
  uint64_t* trace; // round 37, diagnostic: u64 [3 x blocks] chain events (CHAIN_TRACE), or null
};

constexpr int kRowThreads = 128;

// A block's slot after the transform strides up to 256: strides 256 / 512 through scratch (one block barrier: every
// thread of the block calls it), then * norm and the quantiser into row r's xq / xds (and dst when set).
template <int LV>
__device__ __forceinline__ void site_row_tail(const SiteRowArgs& a, const SitePrologue& s, int64_t r, int e, float* scratch,
                                              float (&v)[8]) {
  const int t = threadIdx.x, lane = t & 31, n = 1 << s.log2n;
  if (n > 256) {
    store8(scratch + t * 8, v);
    __syncthreads();
    site_slot_exchange(n, t >> 5, lane, scratch, v);
  }
  site_slot_quantise<LV>(s, int(a.K), e, lane, a.dst ? a.dst + r * a.K : nullptr, a.xq + r * LV * a.K,
                         a.xds + r * (a.K >> 6), v);
}

template <int LV>
__global__ __launch_bounds__(kRowThreads) void site_row_kernel(const SiteRowArgs a) {
  __shared__ __align__(16) float scratch[kRowThreads * 8];  // [128 slots][8]: strides 256 / 512
  CHAIN_TRACE(a.trace, kChainStart);
  pdl_trigger();
  pdl_wait();
  CHAIN_TRACE(a.trace, kChainWait);
  const int64_t r = blockIdx.y;
  const int t = threadIdx.x, lane = t & 31, e = int(blockIdx.x << 10) + 8 * t;
  SitePrologue s = a.s;
  s.src += r * a.ld;
  if (s.src2) s.src2 += r * a.ld;
  float* pre_out = s.pre_out ? s.pre_out + r * a.ld : nullptr;
  float v[8];
  site_slot_front(s, e, lane, 0.f, false, pre_out, v);
  site_row_tail<LV>(a, s, r, e, scratch, v);
  CHAIN_TRACE(a.trace, kChainDone);
}

// AddNorm rows (round 26): block (tile blockIdx.x of C, row blockIdx.y) of a C-block cluster. The slot's src + resid,
// the block's sum of squares (warp sums in warp order) published in shared memory, the C block sums read in rank
// order from every block (the same rr everywhere), then h (resid) stored for the slot and the site as
// site_row_kernel's with the norm as the pre-op. h is stored after the cluster barrier: a release arrive is a GPU-scope
// fence that would wait for it (site_kernel_cluster's `cluster` 2).
// PARTS (round 30): src is nparts partial sums (ffn_fused's chunks), its own instance so the plain one keeps its 40
// registers (a v7 or ffn_fused block holds 53,760 of an SM's 65,536: this block fits beside it below ~92).
template <int C, int LV, bool PARTS = false>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kRowThreads) site_row_norm_kernel(const SiteRowArgs a) {
  __shared__ __align__(16) float scratch[kRowThreads * 8];  // [128 slots][8]: strides 256 / 512
  __shared__ float wsum[kRowThreads / 32];                 // [4] the warps' sums of squares
  __shared__ float bsum;                                    // this block's, read by the cluster
  CHAIN_TRACE(a.trace, kChainStart);
  pdl_trigger();
  const int64_t r = blockIdx.y;
  const int t = threadIdx.x, lane = t & 31, e = int(blockIdx.x << 10) + 8 * t;
  SitePrologue s = a.s;
  // Model constants before the wait (their round trips overlap it; after the cluster barrier, whose asm is a compiler
  // fence, the gain's load was one more L2 round trip on the chain).
  float gn[8];
  load8(s.gain + e, gn);
  uint32_t sg0 = 0, sg1 = 0;  // the slot's sign bytes (site_slot_signs)
  if (s.signs) sg0 = *reinterpret_cast<const uint32_t*>(s.signs + e), sg1 = *reinterpret_cast<const uint32_t*>(s.signs + e + 4);
  pdl_wait();
  CHAIN_TRACE(a.trace, kChainWait);
  s.src += r * a.ld;
  if (s.resid) s.resid += r * a.ld;
  float* pre_out = s.pre_out ? s.pre_out + r * a.ld : nullptr;
  float v[8];
  if constexpr (PARTS) {  // the partials summed in part order, then + resid: site_slot_load's sum
    load8(s.src + e, v);
    // 4 at a time, their loads issued before the adds (this site is on the decode chain: an L2 round trip a partial
    // would cost ~0.5 us each)
    for (int p0 = 1; p0 < s.nparts; p0 += 4) {
      float w[4][8];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (p0 + q < s.nparts) load8(s.src + (p0 + q) * s.part_stride + e, w[q]);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (p0 + q < s.nparts)
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] += w[q][j];
    }
    if (s.resid) {
      float rs[8];
      load8(s.resid + e, rs);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] + rs[j];
    }
  } else {
    site_slot_load(s, e, v);  // src + resid
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  ss = warp_sum(ss);
  if (lane == 0) wsum[t >> 5] = ss;
  __syncthreads();
  if (t == 0) bsum = (wsum[0] + wsum[1]) + (wsum[2] + wsum[3]);
  cluster_arrive();
  cluster_wait();  // every block's bsum visible
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  float tot = 0.f;
#pragma unroll
  for (int b = 0; b < C; ++b) tot += *cl.map_shared_rank(&bsum, unsigned(b));
  cluster_arrive_relaxed();  // done reading the others' bsum (the loads returned); waited for before exit
  if (s.resid) store8(s.resid + e, v);  // h += delta: only this thread reads these elements
  const float rr = rsqrtf(tot / float(a.K) + s.eps);
  // site_slot_front's AddNorm pre-op, pre_out and signs with the preloaded constants (the same operations in the same
  // order), then its transform strides.
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = v[j] * rr * gn[j];
  if (pre_out) store8(pre_out + e, v);
  if (s.signs) site_slot_signs(sg0, sg1, v);
  site_slot_strides(1 << s.log2n, lane, v);
  site_row_tail<LV>(a, s, r, e, scratch, v);
  cluster_wait();
  CHAIN_TRACE(a.trace, kChainDone);
}

// One instance per cluster width (__cluster_dims__ is compile-time), digit count and source form (plain / partials):
// [parts][levels - 1][C - 1].
using RowNormTable = const void* const[2][2][kSiteMaxCluster];
const RowNormTable& row_norm_kernels() {
#define BONSAI_ROW_NORM_ROW(LV, P)                                                                          \
  {reinterpret_cast<const void*>(&site_row_norm_kernel<1, LV, P>), reinterpret_cast<const void*>(&site_row_norm_kernel<2, LV, P>), \
   reinterpret_cast<const void*>(&site_row_norm_kernel<3, LV, P>), reinterpret_cast<const void*>(&site_row_norm_kernel<4, LV, P>), \
   reinterpret_cast<const void*>(&site_row_norm_kernel<5, LV, P>), reinterpret_cast<const void*>(&site_row_norm_kernel<6, LV, P>), \
   reinterpret_cast<const void*>(&site_row_norm_kernel<7, LV, P>), reinterpret_cast<const void*>(&site_row_norm_kernel<8, LV, P>)}
  static RowNormTable kernels = {{BONSAI_ROW_NORM_ROW(1, false), BONSAI_ROW_NORM_ROW(2, false)},
                                 {BONSAI_ROW_NORM_ROW(1, true), BONSAI_ROW_NORM_ROW(2, true)}};
#undef BONSAI_ROW_NORM_ROW
  return kernels;
}

}  // namespace

bool site_row_norm_supported(const SiteDesc& d) {
  const int64_t K = d.K, n = d.n;
  const bool aliased = d.pre_out && (d.pre_out == d.src || d.pre_out == d.resid);
  const bool parts_ok = d.nparts == 1 || (d.nparts > 1 && d.rows == 1 && d.part_stride >= K && d.part_stride % 4 == 0);
  return parts_ok && d.rows >= 1 && d.rows < kSiteWarpMinRows && d.pre == kPreAddNorm && d.gain && !aliased && !d.inverse &&
         !d.perm && d.xq && d.xds && K % 1024 == 0 && K / 1024 <= kSiteMaxCluster && n >= 1 && n <= 1024 &&
         (n & (n - 1)) == 0 && (d.levels == 1 || d.levels == 2) && d.ld % 4 == 0 && aligned16(d.src) &&
         aligned16(d.resid) && aligned16(d.dst) && aligned16(d.pre_out) && aligned16(d.gain);
}

Launch site_row_norm_launch(const SiteDesc& d, int early_rows) {
  SiteRowArgs a{};
  a.s = site_prologue_of(d);
  a.dst = d.dst;
  a.xq = d.xq;
  a.xds = d.xds;
  a.ld = d.ld;
  a.K = d.K;
  const int64_t C = d.K / 1024;
  Launch l = make_launch(row_norm_kernels()[d.nparts > 1 ? 1 : 0][d.levels == 2 ? 1 : 0][C - 1], dim3(unsigned(C), unsigned(d.rows)),
                         dim3(kRowThreads), 0, a);
  // Round 27: at several rows the clusters start only once the kernel before them has completed. Launched early (a
  // programmatic edge) at 5-32 decode rows, bench --batch failed with an unspecified launch failure that PDL off and
  // memcheck (which serialises) did not show, and with this it passes; one row (a sequence's token) keeps its early
  // launch, which is most of the site's gain at batch 1. Round 28: early_rows (Options::site_row_norm_early) is the most
  // rows launched early (2 and 4 passed with the early launch in round 27).
  l.serial_in = d.rows > early_rows;
  return l;
}

bool site_row_supported(const SiteDesc& d) {
  const int64_t K = d.K, n = d.n;
  return d.rows >= 1 && d.rows < kSiteWarpMinRows && !d.inverse && !d.perm && d.xq && d.xds && K % 1024 == 0 &&
         K <= (int64_t(1) << 24) && n >= 1 && n <= 1024 && (n & (n - 1)) == 0 && (d.levels == 1 || d.levels == 2) &&
         d.ld % 4 == 0 && aligned16(d.src) && aligned16(d.src2) && aligned16(d.dst) && aligned16(d.pre_out) &&
         (d.pre == kPreNone || d.pre == kPreSiluMul || d.pre == kPreSigmoidMul ||
          (d.pre == kPreGatedNorm && d.gain && d.seg >= 8 && d.seg <= 256 && 256 % d.seg == 0));
}

Launch site_row_launch(const SiteDesc& d) {
  SiteRowArgs a{};
  a.s = site_prologue_of(d);  // resid: none (no AddNorm here)
  a.dst = d.dst;
  a.xq = d.xq;
  a.xds = d.xds;
  a.ld = d.ld;
  a.K = d.K;
  const void* f = d.levels == 2 ? reinterpret_cast<const void*>(&site_row_kernel<2>)
                                : reinterpret_cast<const void*>(&site_row_kernel<1>);
  return make_launch(f, dim3(unsigned(d.K >> 10), unsigned(d.rows)), dim3(kRowThreads), 0, a);
}

ChainKernel site_row_chain_trace(Launch& l, uint64_t* trace, int64_t capacity) {
  if (!kBlockTraceCompiled || l.size != sizeof(SiteRowArgs) || 3 * launch_blocks(l) > capacity)
    return ChainKernel::kNone;
  ChainKernel kind = ChainKernel::kNone;
  for (int p = 0; p < 2; ++p)
    for (int lv = 0; lv < 2; ++lv)
      for (int c = 0; c < kSiteMaxCluster; ++c)
        if (l.func == row_norm_kernels()[p][lv][c]) kind = p ? ChainKernel::kAddNormSiteParts : ChainKernel::kAddNormSite;
  if (l.func == reinterpret_cast<const void*>(&site_row_kernel<1>) ||
      l.func == reinterpret_cast<const void*>(&site_row_kernel<2>))
    kind = ChainKernel::kRowSite;
  if (kind != ChainKernel::kNone) set_arg_field(l, &SiteRowArgs::trace, trace);
  return kind;
}

}  // namespace bonsai::cuda
