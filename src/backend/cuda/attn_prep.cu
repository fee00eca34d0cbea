// The attention prologue in one launch (Backend::attention_prep): per (head slot, token) block, the q / gate
// split of the q projection, the per-head RMSNorm of q and k, NEOX RoPE, and the K / V rows appended to the
// cache. The op sequence it replaces was 8 launches per attention layer (2 strided copies, 2 norms, 2 RoPEs, 2
// cache copies), each a few microseconds of latency on the decode chain (docs/cuda-kernels.md, round 9).
//
// Arithmetic as the separate kernels (elementwise.cu): the sum of squares per float4 then block_sum, rr =
// rsqrtf(ss / Dh + eps), v * rr * gain, the RoPE angle and rotation in double (positions reach 2^18).
#include "backend/cuda/common.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kPrepMaxThreads = int(kAttnPrepMaxDh / 4);  // one float4 of the head per thread

struct PrepArgs {
  const float* q_gate;  // [M, H, 2 Dh]
  float* q;             // [M, H, Dh]
  float* gate;          // [M, H, Dh]
  const float* k;       // [M, Hkv, Dh]
  const float* v;       // [M, Hkv, Dh]
  const float* q_gain;  // [Dh]
  const float* k_gain;  // [Dh]
  float* k_cache;       // one sequence: [capacity, Hkv, Dh], rows p0 .. p0 + M - 1 written
  float* v_cache;
  int64_t M, H, Hkv, Dh, rot, p0;
  double theta;
  float eps;
  int32_t pad;
};
using PrepRowsArgs = WithRows<PrepArgs>;  // batched: row m at t.pos[m] of caches t.a[m] (K) / t.b[m] (V)

// Block (slot s, token m): s < H is query head s, else KV head s - H. blockDim = Dh / 4 rounded up to 32.
template <class Args>
__global__ __launch_bounds__(kPrepMaxThreads) void attn_prep_kernel(const Args args) {
  const PrepArgs& a = base_of(args);
  __shared__ float y[kAttnPrepMaxDh];  // the normed head (RoPE pairs element i with i + rot / 2)
  __shared__ float red[32];
  pdl_trigger();
  const int64_t s = blockIdx.x, m = blockIdx.y, Dh = a.Dh, row = a.Hkv * Dh;
  const bool is_q = s < a.H;
  const int64_t hk = s - a.H;
  const int t = threadIdx.x, n4 = int(Dh / 4);
  // The gains are model constants: read before waiting on the producer of q_gate / k / v.
  const float4 g = t < n4 ? reinterpret_cast<const float4*>(is_q ? a.q_gain : a.k_gain)[t] : make_float4(1, 1, 1, 1);
  pdl_wait();
  int64_t pos;
  float *kc, *vc;  // this token's K / V cache row
  if constexpr (is_rows_v<Args>) {
    pos = args.t.pos[m];
    kc = args.t.a[m] + pos * row;
    vc = args.t.b[m] + pos * row;
  } else {
    pos = a.p0 + m;
    kc = a.k_cache + pos * row;
    vc = a.v_cache + pos * row;
  }
  const float* src = is_q ? a.q_gate + (m * a.H + s) * 2 * Dh : a.k + (m * a.Hkv + hk) * Dh;
  float4 x = make_float4(0, 0, 0, 0);
  if (t < n4) {
    x = reinterpret_cast<const float4*>(src)[t];
    if (is_q)
      reinterpret_cast<float4*>(a.gate + (m * a.H + s) * Dh)[t] = reinterpret_cast<const float4*>(src + Dh)[t];
    else
      reinterpret_cast<float4*>(vc + hk * Dh)[t] = reinterpret_cast<const float4*>(a.v + (m * a.Hkv + hk) * Dh)[t];
  }
  const float ss = block_sum(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w, red);
  const float rr = rsqrtf(ss / float(Dh) + a.eps);
  if (t < n4) reinterpret_cast<float4*>(y)[t] = make_float4(x.x * rr * g.x, x.y * rr * g.y, x.z * rr * g.z, x.w * rr * g.w);
  __syncthreads();
  float* out = is_q ? a.q + (m * a.H + s) * Dh : kc + hk * Dh;
  const int64_t half = a.rot / 2;
  for (int64_t i = t; i < Dh; i += blockDim.x) {
    float val = y[i];
    if (i < a.rot) {
      const int64_t j = i < half ? i : i - half;  // the pair (j, j + half)
      const double angle = double(pos) * pow(a.theta, -2.0 * double(j) / double(a.rot));
      double sn, cs;
      sincos(angle, &sn, &cs);
      const double x0 = y[j], x1 = y[j + half];
      val = i < half ? float(x0 * cs - x1 * sn) : float(x0 * sn + x1 * cs);
    }
    out[i] = val;
  }
}

}  // namespace

bool attn_prep_supported(int64_t Dh, int64_t rot) {
  return Dh % 4 == 0 && Dh >= 4 && Dh <= kAttnPrepMaxDh && rot % 2 == 0 && rot >= 0 && rot <= Dh;
}

Launch attn_prep_launch(const AttnPrepDesc& d) {
  PrepArgs a{d.q_gate, d.q, d.gate, d.k, d.v, d.q_gain, d.k_gain, d.k_cache, d.v_cache, d.M, d.H, d.Hkv, d.Dh,
             d.rot,    d.p0, double(d.theta), d.eps, 0};
  const dim3 grid(unsigned(d.H + d.Hkv), unsigned(d.M));
  const dim3 block(unsigned((d.Dh / 4 + 31) / 32 * 32));
  if (d.rows) {
    PrepRowsArgs r{a, *d.rows};
    return make_launch(reinterpret_cast<const void*>(&attn_prep_kernel<PrepRowsArgs>), grid, block, 0, r);
  }
  return make_launch(reinterpret_cast<const void*>(&attn_prep_kernel<PrepArgs>), grid, block, 0, a);
}

}  // namespace bonsai::cuda
