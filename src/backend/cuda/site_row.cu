// The activation site of decode rows (round 11): one 128-thread block per 1024-element block of a row, 8 elements per
// thread (warp_site.cuh's slot functions): strides 1-4 in the thread, 8-128 by shuffles, 256 and 512 in one exchange
// through 4 KB of shared memory (one barrier). site_kernel spends a 1024-thread block per tile with a barrier per
// stride of 32 and up; on the decode chain its silu * up site cost ~5.4 us and the gated norm's ~4.3 us (round 10's
// leave-one-out), the latency of those barrier chains. Same operations in the same order as site_kernel (pre-op,
// signs, a + b / a - b per stride, * norm, the quantiser), so xq / xds / dst / pre_out are its own bit for bit for the
// elementwise pre-ops; the gated norm sums its squares in another order. AddNorm rows keep the cluster site (their
// norm needs the whole row), prefill rows the warp site.
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
};

constexpr int kRowThreads = 128;

template <int LV>
__global__ __launch_bounds__(kRowThreads) void site_row_kernel(const SiteRowArgs a) {
  __shared__ __align__(16) float scratch[kRowThreads * 8];  // [128 slots][8]: strides 256 / 512
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.y;
  const int t = threadIdx.x, lane = t & 31, e = int(blockIdx.x << 10) + 8 * t;
  SitePrologue s = a.s;
  s.src += r * a.ld;
  if (s.src2) s.src2 += r * a.ld;
  float* pre_out = s.pre_out ? s.pre_out + r * a.ld : nullptr;
  float v[8];
  site_slot_front(s, e, lane, 0.f, false, pre_out, v);
  const int n = 1 << s.log2n;
  if (n > 256) {
    store8(scratch + t * 8, v);
    __syncthreads();
    site_slot_exchange(n, t >> 5, lane, scratch, v);
  }
  site_slot_quantise<LV>(s, int(a.K), e, lane, a.dst ? a.dst + r * a.K : nullptr, a.xq + r * LV * a.K,
                         a.xds + r * (a.K >> 6), v);
}

}  // namespace

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

}  // namespace bonsai::cuda
