// The Gated DeltaNet delta rule, token by token (moved out of mixers.cu in round 31): delta_kernel (a block per (V
// head, 32-column slice), 4 warps, the prefill tokens of a chunk in order), the decode step of one sequence
// (delta_step_kernel: one block barrier, with its gated-norm site (round 26), conv and a / b pair (round 29) and out
// projection (round 31) optionally in the same launch), batched decode rows (delta_rows_kernel), and delta_launch's
// choice between them. The chunked (WY) form of prefill is delta_chunk.cu.
//
// Block (V head h, 32-column slice j0..j0+31 of Dv), 4 warps: lane = column, warp w owns state rows
// w, w + 4, ... (Dk/4 of them, in registers for the whole call). Columns of S are independent in the
// delta rule (kv_j = sum_i S_ij k_i; S_ij += k_i delta_j; o_j = sum_i S_ij q_i), so slices need no
// communication; per token only the 4 warps' partial sums meet in shared memory.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <stdexcept>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/block_trace.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gdn_inputs.cuh"
#include "backend/cuda/matvec_step.cuh"
#include "backend/cuda/warp_site.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kDeltaWarps = 4;
constexpr int kDeltaRows = int(kDeltaMaxDk / kDeltaWarps);  // 32 rows per thread at Dk = 128

struct DeltaArgs {
  float* state;
  float* q;
  float* k;
  const float* v;
  float* g;
  float* beta;
  float* out;
  const float* a;
  const float* b;
  const float* A;
  const float* dt_bias;
  int64_t T, Nk, Nv, Dk, Dv;
  int64_t ldq, ldk, ldv;  // floats between consecutive tokens' q / k / v rows
  int32_t l2_q, l2_k;
  float eps_q, eps_k, q_scale;
  int32_t pad;
  uint64_t* trace;  // round 37, diagnostic: delta_step_kernel's u64 [3 x blocks] chain events (CHAIN_TRACE), or null
};
using DeltaRowsArgs = WithRows<DeltaArgs>;  // batched decode: token m is row m's, with its own state

template <class Args>
__global__ __launch_bounds__(kDeltaWarps * 32) void delta_kernel(const Args args) {
  constexpr bool kRows = is_rows_v<Args>;
  const DeltaArgs& a = base_of(args);
  __shared__ float ks[kDeltaMaxDk], qs[kDeltaMaxDk];
  __shared__ float red[kDeltaWarps][32], red2[kDeltaWarps][32], bred[32];
  __shared__ float gb[2];
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t h = blockIdx.x, j = int64_t(blockIdx.y) * 32 + lane;
  const int64_t rep = a.Nv / a.Nk, kh = h / rep;
  const int R = int(a.Dk / kDeltaWarps);
  // Tokens [t0, t1) of this block: all T of one sequence, or (batched) token z of sequence z.
  int64_t t0 = 0, t1 = a.T;
  float* Sg = a.state + h * a.Dk * a.Dv;
  if constexpr (kRows) {
    t0 = blockIdx.z;
    t1 = t0 + 1;
    Sg = args.t.a[t0] + h * a.Dk * a.Dv;
  }
  // The state slice into L2 while the previous kernel still runs (this block launched early by PDL): lane l
  // of warp w takes the 128-byte row slice w + 4 l. A prefetch cannot read stale data (L2 is the point of
  // coherence), so it may precede the wait; the loads below then hit L2 (batch 1: a 3 MB state per layer).
  if (lane < R) prefetch_l2(Sg + (warp + kDeltaWarps * lane) * a.Dv + (j - lane));
  pdl_wait();
  float s[kDeltaRows];
#pragma unroll
  for (int ii = 0; ii < kDeltaRows; ++ii) s[ii] = ii < R ? Sg[(warp + kDeltaWarps * ii) * a.Dv + j] : 0.f;

  // Next token's inputs are loaded one token ahead, so their latency hides behind this token's barriers.
  float kv_n = 0.f, qv_n = 0.f, vj_n = 0.f, ga_n = 0.f, gb_n = 0.f;
  auto load_token = [&](int64_t t) {
    if (tid < a.Dk) {
      kv_n = a.k[t * a.ldk + kh * a.Dk + tid];
      qv_n = a.q[t * a.ldq + kh * a.Dk + tid];
    }
    vj_n = a.v[t * a.ldv + h * a.Dv + j];
    if (tid == 0) {
      ga_n = a.a ? a.a[t * a.Nv + h] : a.g[t * a.Nv + h];
      gb_n = a.a ? a.b[t * a.Nv + h] : a.beta[t * a.Nv + h];
    }
  };
  if (t1 > t0) load_token(t0);
  for (int64_t t = t0; t < t1; ++t) {
    float kv = kv_n, qv = qv_n;
    const float vj = vj_n, ga = ga_n, gbv = gb_n;
    if (t + 1 < t1) load_token(t + 1);
    if (a.l2_k) kv *= rsqrtf(block_sum(kv * kv, bred) + a.eps_k);
    if (a.l2_q) qv *= rsqrtf(block_sum(qv * qv, bred) + a.eps_q);
    qv *= a.q_scale;
    if (tid < a.Dk) {
      ks[tid] = kv;
      qs[tid] = qv;
    }
    if (tid == 0) {
      float gv, bv;
      if (a.a) {
        const float u = ga + a.dt_bias[h];
        gv = a.A[h] * (u > 20.f ? u : log1pf(expf(u)));
        bv = 1.f / (1.f + expf(-gbv));
        if (blockIdx.y == 0) {
          a.g[t * a.Nv + h] = gv;
          a.beta[t * a.Nv + h] = bv;
        }
      } else {
        gv = ga;
        bv = gbv;
      }
      gb[0] = expf(gv);
      gb[1] = bv;
    }
    __syncthreads();
    const float decay = gb[0], beta = gb[1];
    float kvp = 0.f;
#pragma unroll
    for (int ii = 0; ii < kDeltaRows; ++ii) {
      if (ii < R) {
        s[ii] *= decay;
        kvp += s[ii] * ks[warp + kDeltaWarps * ii];
      }
    }
    red[warp][lane] = kvp;
    __syncthreads();
    float kvj = 0.f;
#pragma unroll
    for (int w = 0; w < kDeltaWarps; ++w) kvj += red[w][lane];
    const float delta = beta * (vj - kvj);
    float op = 0.f;
#pragma unroll
    for (int ii = 0; ii < kDeltaRows; ++ii) {
      if (ii < R) {
        s[ii] += ks[warp + kDeltaWarps * ii] * delta;
        op += s[ii] * qs[warp + kDeltaWarps * ii];
      }
    }
    red2[warp][lane] = op;
    __syncthreads();
    if (warp == 0) {
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < kDeltaWarps; ++w) o += red2[w][lane];
      a.out[(t * a.Nv + h) * a.Dv + j] = o;
    }
    __syncthreads();  // ks, qs, red, red2, gb are rewritten by the next token
  }
#pragma unroll
  for (int ii = 0; ii < kDeltaRows; ++ii)
    if (ii < R) Sg[(warp + kDeltaWarps * ii) * a.Dv + j] = s[ii];
}

// The gates of V head h (delta_step_kernel, delta_rows_kernel; delta_kernel computes them in one thread): g = A softplus(a + dt_bias) and beta = sigmoid(b) when the launch computes them (a.a set),
// else the given g and beta.
__device__ __forceinline__ void delta_gates(const DeltaArgs& a, int64_t h, float ga, float gb, float& gv, float& bv) {
  if (a.a) {
    const float u = ga + a.dt_bias[h];
    gv = a.A[h] * (u > 20.f ? u : log1pf(expf(u)));
    bv = 1.f / (1.f + expf(-gb));
  } else {
    gv = ga;
    bv = gb;
  }
}

// The gated-norm site fused into the decode step (round 26, DeltaDesc::site): the site_row_kernel arguments of row 0.
struct DeltaSiteArgs {
  DeltaArgs a;
  SitePrologue s;   // src = a.out, src2 = z, gain, signs, pre = kPreGatedNorm; pre_out: the normed row or null
  float* dst;       // [K] the fp32 site, or null
  int8_t* xq;       // [LV, K]
  float2* xds;      // [K / 64]
  int32_t* count;   // int32 [K / 1024] blocks arrived per chunk; zero between launches
  int64_t K;        // Nv Dv
};
__device__ __forceinline__ const DeltaArgs& step_args(const DeltaArgs& a) { return a; }
__device__ __forceinline__ const DeltaArgs& step_args(const DeltaSiteArgs& x) { return x.a; }
template <int LV>
using DeltaStepArgs = std::conditional_t<LV == 0, DeltaArgs, DeltaSiteArgs>;

// Round 29 (DeltaDesc::conv): the step's own q / k / v conv and a / b pair. q0 / k0 / v0: the first channel of q, k, v
// in the conv's rows (DeltaConvIn::out and x).
struct DeltaConvArgs {
  const float* x;
  float* state;
  const float* taps;
  const void* wa;
  const void* wb;
  const float* dx;
  int32_t* count;
  int64_t C, Kc, E, q0, k0, v0;
};
template <int LV>
struct DeltaConvStepArgs {
  DeltaStepArgs<LV> s;
  DeltaConvArgs c;
};
static_assert(sizeof(DeltaConvStepArgs<0>) == sizeof(DeltaArgs) + sizeof(DeltaConvArgs) &&
                  sizeof(DeltaConvStepArgs<2>) == sizeof(DeltaSiteArgs) + sizeof(DeltaConvArgs),
              "no padding holes: equal arguments must be equal bytes (launch.h)");
template <int LV>
__device__ __forceinline__ const DeltaArgs& step_args(const DeltaConvStepArgs<LV>& x) {
  return step_args(x.s);
}
// The kernel's argument: the step (with its site when LV != 0), and its conv inputs when CONV.
template <int LV, bool CONV>
using DeltaKernelArgs = std::conditional_t<CONV, DeltaConvStepArgs<LV>, DeltaStepArgs<LV>>;
template <int LV>
__device__ __forceinline__ const DeltaStepArgs<LV>& site_part(const DeltaStepArgs<LV>& x) { return x; }
template <int LV>
__device__ __forceinline__ const DeltaStepArgs<LV>& site_part(const DeltaConvStepArgs<LV>& x) { return x.s; }

// The fused site's two halves in a step block. Arrival, by warp 0 right after its outputs (the block's 32 of out):
// fence them, count the block into its 1024-chunk; `last` (shared) tells the block whether the chunk's other 31
// blocks are in. Only warp 0's own stores sit before the fence, so the state's write-back (16 KB a block, by every
// warp after this) is not waited for: a fence after it cost the whole step (round 26: tg128 -0.4 to -1.3 %).
__device__ __forceinline__ void delta_site_arrive(const DeltaSiteArgs& x, int64_t e0, int lane, int& last) {
  __threadfence();
  __syncwarp();
  if (lane == 0) last = atomicAdd(x.count + (e0 >> 10), 1) == (1024 / 32) - 1;
}
// The rest, by the whole block after its state stores: the chunk's last block runs site_row_kernel's body on the
// chunk with its first 4 warps (the slot functions: 128 threads x 8 elements), then zeroes the counter for the next
// launch. The chunk is read with ld.global.cg: other SMs wrote it during this launch, so this SM's L1 may hold older
// lines of it.
template <int LV>
__device__ __forceinline__ void delta_site_finish(const DeltaSiteArgs& x, int64_t e0, const int& last) {
  __shared__ __align__(16) float scratch[128 * 8];  // [128 slots][8]: strides 256 / 512
  const int tid = threadIdx.x, lane = tid & 31;
  const int chunk = int(e0 >> 10);
  __syncthreads();  // `last` from warp 0
  if (!last) return;
  __threadfence();  // the other blocks' outputs, seen through their arrivals
  if (tid < 128) {
    const int e = (chunk << 10) + 8 * tid;
    float v[8];
    const float4 lo = __ldcg(reinterpret_cast<const float4*>(x.a.out + e));
    const float4 hi = __ldcg(reinterpret_cast<const float4*>(x.a.out + e + 4));
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    site_slot_front(x.s, e, lane, 0.f, true, x.s.pre_out, v);
    if ((1 << x.s.log2n) > 256) {
      store8(scratch + tid * 8, v);
      asm volatile("bar.sync 1, 128;" ::: "memory");
      site_slot_exchange(1 << x.s.log2n, tid >> 5, lane, scratch, v);
    }
    site_slot_quantise<LV>(x.s, int(x.K), e, lane, x.dst, x.xq, x.xds, v);
  }
  if (tid == 0) x.count[chunk] = 0;
}

// Round 31 (DeltaDesc::out): the out projection of the fused site's digits in the same launch. Chunk c's 32 blocks
// (the 8 V heads x 4 slices that write out's columns [1,024 c, 1,024 c + 1,024)) each take D / 32 of the projection's
// rows over those columns only, and write chunk c's share of every row into parts[c]: the site is blockwise (Hadamard
// block <= 1,024, one unit per 128-group), so the chunk's digits are all a block needs, and the kernel after sums the
// Nv Dv / 1,024 partials (the AddNorm row site's PARTS instance). A block copies its rows' 256 B of words and 16 B of
// scales into shared memory at its start (cp.async, before pdl_wait: the weights depend on nothing), so they land
// while the step computes; after its state pass it waits for its chunk's site (the chunk's last block publishes a
// flag once the digits are stored), reads the digits and runs v7's step (matvec_step.cuh) over the resident rows.
constexpr int kDeltaOutMaxRows = 256;  // rows of the projection a block takes at most (D <= 8,192)
constexpr int kDeltaOutRowBytes = 320;  // a row's 256 B of words padded to 320: lanes g, g + 1 of an ldmatrix-free
                                        // uint4 load then fall in different banks (256 would put all 8 rows on one)

struct DeltaOutArgs {
  const uint32_t* ow;  // u32 [D, K / 16] the projection's words (K = Nv Dv)
  const uint16_t* os;  // fp16 [D, K / 128] its scales
  float* parts;        // [K / 1024, D] chunk c's share of the projection
  int32_t* flags;      // int32 [2 K / 1024] per chunk: the site is ready, blocks departed (zero between launches)
  int64_t D;           // rows of the projection
};
template <int LV, bool CONV>
struct DeltaOutStepArgs {
  DeltaKernelArgs<LV, CONV> k;
  DeltaOutArgs o;
};
static_assert(sizeof(DeltaOutStepArgs<2, true>) == sizeof(DeltaConvStepArgs<2>) + sizeof(DeltaOutArgs) &&
                  sizeof(DeltaOutStepArgs<1, false>) == sizeof(DeltaSiteArgs) + sizeof(DeltaOutArgs),
              "no padding holes: equal arguments must be equal bytes (launch.h)");
template <int LV, bool CONV>
__device__ __forceinline__ const DeltaArgs& step_args(const DeltaOutStepArgs<LV, CONV>& x) {
  return step_args(x.k);
}
template <int LV, bool CONV>
__device__ __forceinline__ const DeltaStepArgs<LV>& site_part(const DeltaOutStepArgs<LV, CONV>& x) {
  return site_part<LV>(x.k);
}
// The conv inputs of a CONV instance.
template <int LV>
__device__ __forceinline__ const DeltaConvArgs& conv_args(const DeltaConvStepArgs<LV>& x) { return x.c; }
template <int LV>
__device__ __forceinline__ const DeltaConvArgs& conv_args(const DeltaOutStepArgs<LV, true>& x) { return x.k.c; }
// The kernel's argument with OUT: the step's (DeltaKernelArgs) and the projection's.
template <int LV, bool CONV, bool OUT>
using DeltaStepKernelArgs = std::conditional_t<OUT, DeltaOutStepArgs<LV, CONV>, DeltaKernelArgs<LV, CONV>>;

// The block's rows of the projection (D / 32 of them, starting at row0 = r D / 32 for the block's index r in its chunk)
// over chunk c's columns -> wsm [rows][320 B] words | [rows][16 B] scales, in flight (one commit group).
__device__ __forceinline__ void delta_out_prefetch(const DeltaOutArgs& o, int64_t K, int64_t e0, unsigned char* wsm) {
  const int chunk = int(e0 >> 10), r = int((e0 & 1023) >> 5);
  const int rows = int(o.D >> 5);
  const int64_t row0 = int64_t(r) * rows, wrs = K >> 2, srs = K >> 6;  // bytes per row of words / scales
  const char* wsrc = reinterpret_cast<const char*>(o.ow) + row0 * wrs + 256 * chunk;
  const char* ssrc = reinterpret_cast<const char*>(o.os) + row0 * srs + 16 * chunk;
  for (int i = threadIdx.x; i < 17 * rows; i += blockDim.x) {
    const int rr = i >> 4, q = i & 15, sr = i - 16 * rows;  // words: row rr, piece q; scales: row sr
    if (i < 16 * rows) cp_async16(wsm + rr * kDeltaOutRowBytes + 16 * q, wsrc + rr * wrs + 16 * q, 16);
    else cp_async16(wsm + rows * kDeltaOutRowBytes + 16 * sr, ssrc + sr * srs, 16);
  }
  cp_async_commit();
}

// After delta_site_finish, by the whole block (W = 8 warps): chunk c's digits once its site is stored, then the
// block's rows of the projection: warp w takes the chunk's step w % 4 (256 columns) of the 16-row blocks w / 4, w / 4
// + 2, ...; each row's 4 steps are added in step order into parts[c]. Flags: the chunk's last block (last, the one
// that ran the site) publishes ready; every block departs once it has read the digits, and the last to depart zeroes
// both for the next launch (which touches them only after its pdl_wait, i.e. after this launch has completed).
template <int LV>
__device__ __forceinline__ void delta_out(const DeltaOutArgs& o, const DeltaSiteArgs& x, int64_t e0, const int& last,
                                          const unsigned char* wsm) {
  __shared__ __align__(16) int8_t xs[LV * 1024];  // [LV][1,024] the chunk's digits
  __shared__ __align__(16) float2 xs_d[16];       // [16] their units
  __shared__ float red[4][kDeltaOutMaxRows];      // [step][row] the warps' partial rows
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int chunk = int(e0 >> 10), r = int((e0 & 1023) >> 5);
  const int rows = int(o.D >> 5);
  int32_t* flag = o.flags + 2 * chunk;
  __threadfence();  // the last block's site stores (its threads < 128) before its release below
  __syncthreads();
  if (tid == 0) {
    if (last) {
      asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(flag), "r"(1) : "memory");
    } else {
      poll_until_at_least(flag, 1);
    }
  }
  __syncthreads();
  // The digits: other blocks wrote them in this launch (ld.global.cg: not this SM's L1).
  for (int i = tid; i < LV * 64 + 8; i += blockDim.x) {
    if (i < LV * 64)
      reinterpret_cast<uint4*>(xs)[i] =
          __ldcg(reinterpret_cast<const uint4*>(x.xq + (i >> 6) * x.K + 1024 * chunk) + (i & 63));
    else
      reinterpret_cast<uint4*>(xs_d)[i - LV * 64] =
          __ldcg(reinterpret_cast<const uint4*>(x.xds + 16 * chunk) + (i - LV * 64));
  }
  cp_async_wait<0>();
  __syncthreads();  // the digits and the block's weight rows are in shared memory
  if (tid == 0) depart_and_reset(flag, 32);  // the chunk's 32 blocks
  const Mv7OneToken<LV> ln(lane);
  const int cc = w & 3;
  uint4 XP[4];
  float4 xv0, xv1;
  ln.load_b(cc, 1024, xs, xs_d, XP, xv0, xv1);
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(wsm + rows * kDeltaOutRowBytes);
  for (int b = w >> 2; b < (rows >> 4); b += 2) {
    const int row = 16 * b + ln.g;
    float yg[1] = {}, yg8[1] = {};
    mv7_window_step<LV, 1>(wsm + row * kDeltaOutRowBytes + 16 * ln.t, 0, kDeltaOutRowBytes,
                           sc + row * 8 + (LV == 2 ? (ln.t & 1) : 0), 0, 8, 8, cc, ln.t, XP, xv0, xv1, yg, yg8);
    mv7_put_rows<LV, 1>(&red[cc][row], ln.holder, yg, yg8);
  }
  __syncthreads();
  for (int rr = tid; rr < rows; rr += blockDim.x)
    o.parts[int64_t(chunk) * o.D + int64_t(r) * rows + rr] = ((red[0][rr] + red[1][rr]) + red[2][rr]) + red[3][rr];
}

// One decode token of one sequence (T = 1), with ONE block barrier (round 14). The delta rule
// rearranged so the pass over the old state needs neither the norms nor the gates: with raw k, q, nk = 1 / |k|,
// nq = q_scale / |q|, P_j = sum_i S_ij k_i, Q_j = sum_i S_ij q_i, kq = k . q (all from the OLD state),
//   kv_j = decay nk P_j,  delta_j = beta (v_j - kv_j),  o_j = decay nq Q_j + delta_j nk nq kq,
//   S_ij <- decay S_ij + nk k_i delta_j,
// which is the token loop's algebra (decay the state, kv, delta, update, read with q) in another order. The
// warps' partial P, Q and the three dot products meet in shared memory once; every thread computes the gates
// itself (a few transcendental instructions instead of a barrier). delta_kernel needed five barriers per token
// and two block reductions in a row before the state pass; the decode chain measured it at 7.7 us per layer.
// W warps per block: warp w owns state rows w, w + W, ... of the block's 32-column slice. LV 1 / 2 (round 26): the
// gated-norm site of out follows in the same launch (delta_site_arrive / delta_site_finish, q8 / q16); 0: none.
// CONV (round 29, W = 8, DeltaDesc::conv): the block first computes its own inputs, which conv_dense_kernel computed
// one launch earlier: thread t < 2 Dk the conv (+ SiLU) of q / k channel t of its K head, warp 0 the 32 v channels
// of its slice, and every thread its share of the a / b dot products of row h (dense_block's thread layout and sums,
// the warps' partials added in warp order: the same values bit for bit), met by one more block barrier. The v
// channels' conv state is the block's own: warp 0 shifts it in place. The q / k channels' state is read by the
// (Nv / Nk) x (Dv / 32) blocks of the K head: each counts itself in after its reads (count[kh]), and the last one
// shifts that state once all have read it (no block waits for another: the pattern of delta_site_arrive).
// OUT (round 31, W = 8, LV != 0): the out projection of the site's digits follows (delta_out), two blocks an SM at
// least: chunk c's blocks wait for its site, so all of the grid must be resident at once (delta_out_resident).
template <int W, int LV = 0, bool CONV = false, bool BF16 = false, bool OUT = false>
__global__ __launch_bounds__(W * 32, OUT ? 2 : 0) void delta_step_kernel(
    const DeltaStepKernelArgs<LV, CONV, OUT> args) {
  static_assert(!CONV || W == 8, "the fused conv's a / b sums follow dense_block's 256 threads");
  static_assert(!OUT || (W == 8 && LV != 0), "the out projection: 8 warps (4 steps x 2 row blocks), after the site");
  const DeltaArgs& a = step_args(args);
  constexpr int kR = int(kDeltaMaxDk) / W;  // state rows per thread at most
  __shared__ float part[W][2][32];  // [warp][P, Q][lane]
  __shared__ float dots[W][3];      // [warp][k.k, q.q, k.q]
  CHAIN_TRACE(a.trace, kChainStart);
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t h = blockIdx.x, j = int64_t(blockIdx.y) * 32 + lane;
  const int64_t rep = a.Nv / a.Nk, kh = h / rep;
  const int R = int(a.Dk) / W;
  const int64_t t = 0;
  float* Sg = a.state + h * a.Dk * a.Dv;
  if (lane < R) prefetch_l2(Sg + (warp + W * lane) * a.Dv + (j - lane));  // as delta_kernel: L2 while the wait runs
  extern __shared__ __align__(16) unsigned char out_w[];  // OUT: the block's projection rows (delta_out_prefetch)
  if constexpr (OUT) delta_out_prefetch(args.o, a.Nv * a.Dv, h * a.Dv + int64_t(blockIdx.y) * 32, out_w);
  // CONV: this thread's q / k channel (-1: none) and warp 0's v channel, their taps (model constants: read before the
  // wait), the a / b rows into L2 (as dense_block does).
  [[maybe_unused]] int64_t qk_ch = -1, v_ch = -1;
  [[maybe_unused]] float qk_tap[kMaxConvKernel], v_tap[kMaxConvKernel];
  if constexpr (CONV) {
    const DeltaConvArgs& c = conv_args(args);
    if (tid < 2 * a.Dk) qk_ch = tid < a.Dk ? c.q0 + kh * a.Dk + tid : c.k0 + kh * a.Dk + (tid - a.Dk);
    if (warp == 0) v_ch = c.v0 + j + h * a.Dv;
#pragma unroll
    for (int i = 0; i < kMaxConvKernel; ++i) {
      qk_tap[i] = qk_ch >= 0 && i < c.Kc ? c.taps[qk_ch * c.Kc + i] : 0.f;
      v_tap[i] = v_ch >= 0 && i < c.Kc ? c.taps[v_ch * c.Kc + i] : 0.f;
    }
    const int64_t row_bytes = c.E * (BF16 ? 2 : 4);
    for (int64_t off = int64_t(tid) * 128; off < row_bytes; off += W * 32 * 128) {
      prefetch_l2(static_cast<const char*>(c.wa) + h * row_bytes + off);
      prefetch_l2(static_cast<const char*>(c.wb) + h * row_bytes + off);
    }
  }
  pdl_wait();
  CHAIN_TRACE(a.trace, kChainWait);
  __shared__ float conv_qk[CONV ? 2 * kDeltaMaxDk : 1];  // CONV: q then k of the K head after the conv
  __shared__ float conv_v[CONV ? 32 : 1];                // CONV: v of the block's 32 columns
  __shared__ float ab_part[CONV ? 2 : 1][W];             // CONV: [a, b][warp] partial dot products
  __shared__ int qk_last;                                // CONV: this block shifts the K head's q / k conv state
  [[maybe_unused]] float qk_win[kMaxConvKernel];  // CONV: this thread's q / k channel's window, then its new state
  if constexpr (CONV) {
    const DeltaConvArgs& c = conv_args(args);
    const int Pc = int(c.Kc - 1);
    if (qk_ch >= 0) {
#pragma unroll
      for (int i = 0; i < kMaxConvKernel; ++i) qk_win[i] = i < Pc ? c.state[i * c.C + qk_ch] : 0.f;
      conv_qk[tid] = conv_token(qk_tap, qk_win, c.x[qk_ch], Pc);  // written back below, by the K head's last block
    }
    if (v_ch >= 0) {
      float win[kMaxConvKernel];
#pragma unroll
      for (int i = 0; i < kMaxConvKernel; ++i) win[i] = i < Pc ? c.state[i * c.C + v_ch] : 0.f;
      conv_v[lane] = conv_token(v_tap, win, c.x[v_ch], Pc);
#pragma unroll
      for (int i = 0; i < kMaxConvKernel; ++i)
        if (i < Pc) c.state[i * c.C + v_ch] = win[i];  // this block's own channels
    }
    float sa = 0.f, sb = 0.f;
    for (int64_t i = int64_t(tid) * 8; i < c.E; i += W * 32 * 8) {
      float f[8];
      const float4 x0 = *reinterpret_cast<const float4*>(c.dx + i), x1 = *reinterpret_cast<const float4*>(c.dx + i + 4);
      wload8<BF16>(c.wa, h * c.E + i, f);
      sa += dot8(f, x0, x1);
      wload8<BF16>(c.wb, h * c.E + i, f);
      sb += dot8(f, x0, x1);
    }
    sa = warp_sum(sa);
    sb = warp_sum(sb);
    if (lane == 0) ab_part[0][warp] = sa, ab_part[1][warp] = sb;
    __syncthreads();  // the conv outputs and the a / b partials
    if (tid == 0) {   // this block has read the K head's q / k conv state (its values are in conv_qk)
      __threadfence();
      qk_last = atomicAdd(c.count + kh, 1) == int(rep * gridDim.y) - 1;
    }
  }
  float s[kR], kr[kR];
  float P = 0.f, Q = 0.f, kk = 0.f, qq = 0.f, kq = 0.f;
  const float* kp = CONV ? conv_qk + a.Dk : a.k + t * a.ldk + kh * a.Dk;
  const float* qp = CONV ? conv_qk : a.q + t * a.ldq + kh * a.Dk;
#pragma unroll
  for (int ii = 0; ii < kR; ++ii) {
    const int i = warp + W * ii;
    s[ii] = ii < R ? Sg[i * a.Dv + j] : 0.f;
    kr[ii] = ii < R ? kp[i] : 0.f;  // the same address in every lane: one broadcast load
  }
  float vj, ga, gbv;
  if constexpr (CONV) {
    vj = conv_v[lane];
    ga = gbv = 0.f;  // dense_block's order: warp 0's partial first
#pragma unroll
    for (int w = 0; w < W; ++w) ga += ab_part[0][w], gbv += ab_part[1][w];
  } else {
    vj = a.v[t * a.ldv + h * a.Dv + j];
    ga = a.a ? a.a[t * a.Nv + h] : a.g[t * a.Nv + h];
    gbv = a.a ? a.b[t * a.Nv + h] : a.beta[t * a.Nv + h];
  }
#pragma unroll
  for (int ii = 0; ii < kR; ++ii) {
    if (ii < R) {
      const float qi = qp[warp + W * ii];
      P += s[ii] * kr[ii];
      Q += s[ii] * qi;
      kk += kr[ii] * kr[ii];
      qq += qi * qi;
      kq += kr[ii] * qi;
    }
  }
  part[warp][0][lane] = P;
  part[warp][1][lane] = Q;
  if (lane == 0) {  // the dot products are the same in every lane of a warp
    dots[warp][0] = kk;
    dots[warp][1] = qq;
    dots[warp][2] = kq;
  }
  // The gates, in every thread (before the barrier: their latency overlaps the other warps' passes).
  float gv, bv;
  delta_gates(a, h, ga, gbv, gv, bv);
  const float decay = expf(gv);
  __syncthreads();
  P = Q = kk = qq = kq = 0.f;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    P += part[w][0][lane];
    Q += part[w][1][lane];
    kk += dots[w][0];
    qq += dots[w][1];
    kq += dots[w][2];
  }
  const float nk = a.l2_k ? rsqrtf(kk + a.eps_k) : 1.f;
  const float nq = (a.l2_q ? rsqrtf(qq + a.eps_q) : 1.f) * a.q_scale;
  const float delta = bv * (vj - decay * nk * P);
  if (a.a && blockIdx.y == 0 && tid == 0) {  // as delta_kernel: the gates for the buffers' later readers
    a.g[t * a.Nv + h] = gv;
    a.beta[t * a.Nv + h] = bv;
  }
  const int64_t e0 = h * a.Dv + int64_t(blockIdx.y) * 32;  // the block's first element of out
  __shared__ int site_last;  // LV != 0: this block is its out chunk's last (delta_site_arrive)
  if (warp == 0) {
    a.out[t * a.Nv * a.Dv + e0 + lane] = decay * nq * Q + delta * nk * nq * kq;
    if constexpr (LV != 0) delta_site_arrive(site_part<LV>(args), e0, lane, site_last);
  }
  const float kd = nk * delta;
#pragma unroll
  for (int ii = 0; ii < kR; ++ii)
    if (ii < R) Sg[(warp + W * ii) * a.Dv + j] = decay * s[ii] + kr[ii] * kd;
  if constexpr (CONV) {
    if (qk_last) {  // every block of the K head has read its q / k conv state (qk_last: set before the barrier above)
      const DeltaConvArgs& c = conv_args(args);
      __threadfence();
      if (qk_ch >= 0)
#pragma unroll
        for (int i = 0; i < kMaxConvKernel; ++i)
          if (i + 1 < c.Kc) c.state[i * c.C + qk_ch] = qk_win[i];
      if (tid == 0) c.count[kh] = 0;
    }
  }
  if constexpr (LV != 0) delta_site_finish<LV>(site_part<LV>(args), e0, site_last);
  if constexpr (OUT) delta_out<LV>(args.o, site_part<LV>(args), e0, site_last, out_w);
  CHAIN_TRACE(a.trace, kChainDone);
}

// Batched decode (round 18): one token of each of B sequences, one block per (V head, sequence) with W warps, the
// one-barrier algebra of delta_step_kernel. Lane l owns columns 4l .. 4l + 3 (Dv = 128: float4 loads and stores, a
// warp covers a whole state row), warp w rows w, w + W, ... So a block streams its whole
// [Dk, Dv] state (64 KB at 128 x 128) with every load issued before the first use, and one barrier per token
// instead of delta_kernel's five (the state traffic is the limit at B = 32: 32 x 151 MB read and written per step).
// Round 22 (DeltaDesc::rows_split = 2 / 4): the state's columns are independent (each column's P, Q and update read
// only that column and the shared k / q), so a block may take a slice of 128 / split columns (CPL = 4 / split per
// lane, blockIdx.z the slice). Every slice block recomputes the k.k / q.q / k.q dots in the same order (identical
// values), so the result is bit-identical to split 1; smaller blocks (fewer registers) put more of them, and more
// state bytes, in flight per SM.
// A lane's CPL columns as floats.
template <class V>
__device__ __forceinline__ float* cols(V& v) { return reinterpret_cast<float*>(&v); }
template <class V>
__device__ __forceinline__ const float* cols(const V& v) { return reinterpret_cast<const float*>(&v); }
template <int CPL>
using ColVec = std::conditional_t<CPL == 4, float4, std::conditional_t<CPL == 2, float2, float>>;

// Blocks per SM the launch bound asks for: 8 warps at 4 / 2 / 1 columns a lane fit 2 / 3 / 4 (128 / 80 / 64
// registers, no spills); 16 warps keep round 18's 2.
template <int W, int CPL>
constexpr int delta_rows_min_blocks() { return W == 8 ? (CPL == 4 ? 2 : CPL == 2 ? 3 : 4) : 2; }

template <int W, int CPL = 4>
__global__ __launch_bounds__(W * 32, delta_rows_min_blocks<W, CPL>()) void delta_rows_kernel(const DeltaRowsArgs args) {
  using V = ColVec<CPL>;  // a lane's CPL columns
  constexpr int kR = int(kDeltaMaxDk) / W;  // state rows per thread at most
  constexpr int kDv = 32 * CPL;  // columns of the block's slice
  constexpr int kDvFull = 128;   // the state's row length (Dv)
  const DeltaArgs& a = args.a;
  __shared__ float part[W][2][kDv];  // [warp][P, Q][column]
  __shared__ float dots[W][3];       // [warp][k.k, q.q, k.q]
  pdl_trigger();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t h = blockIdx.x, m = blockIdx.y;  // V head, row (its own sequence's token)
  const int64_t c0 = int64_t(blockIdx.z) * kDv;  // the slice's first column
  const int64_t rep = a.Nv / a.Nk, kh = h / rep;
  const int R = int(a.Dk) / W;
  float* Sg = args.t.a[m] + h * a.Dk * kDvFull + c0;  // [Dk, Dv] row-major, this slice's columns
  // The state into L2 while the previous kernel still runs (as delta_kernel): one 128-byte line per 32 / CPL lanes.
  if ((lane & (32 / CPL - 1)) == 0)
    for (int ii = 0; ii < R; ++ii) prefetch_l2(Sg + (warp + W * ii) * kDvFull + CPL * lane);
  pdl_wait();
  V s[kR];
  float kr[kR];
  const float* kp = a.k + m * a.ldk + kh * a.Dk;
  const float* qp = a.q + m * a.ldq + kh * a.Dk;
#pragma unroll
  for (int ii = 0; ii < kR; ++ii) {
    const int i = warp + W * ii;
    if (ii < R) {
      s[ii] = *reinterpret_cast<const V*>(Sg + i * kDvFull + CPL * lane);
      kr[ii] = kp[i];  // the same address in every lane: one broadcast load
    }
  }
  const V vj = *reinterpret_cast<const V*>(a.v + m * a.ldv + h * kDvFull + c0 + CPL * lane);
  const float ga = a.a ? a.a[m * a.Nv + h] : a.g[m * a.Nv + h];
  const float gbv = a.a ? a.b[m * a.Nv + h] : a.beta[m * a.Nv + h];
  float P[CPL], Q[CPL], kk = 0.f, qq = 0.f, kq = 0.f;
#pragma unroll
  for (int c = 0; c < CPL; ++c) P[c] = Q[c] = 0.f;
#pragma unroll
  for (int ii = 0; ii < kR; ++ii) {
    if (ii < R) {
      const float qi = qp[warp + W * ii];
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        P[c] += cols(s[ii])[c] * kr[ii];
        Q[c] += cols(s[ii])[c] * qi;
      }
      kk += kr[ii] * kr[ii];
      qq += qi * qi;
      kq += kr[ii] * qi;
    }
  }
#pragma unroll
  for (int c = 0; c < CPL; ++c) {
    part[warp][0][CPL * lane + c] = P[c];
    part[warp][1][CPL * lane + c] = Q[c];
  }
  if (lane == 0) {
    dots[warp][0] = kk;
    dots[warp][1] = qq;
    dots[warp][2] = kq;
  }
  float gv, bv;  // the gates, in every thread, before the barrier
  delta_gates(a, h, ga, gbv, gv, bv);
  const float decay = expf(gv);
  __syncthreads();
  kk = qq = kq = 0.f;
#pragma unroll
  for (int c = 0; c < CPL; ++c) P[c] = Q[c] = 0.f;
#pragma unroll
  for (int w = 0; w < W; ++w) {
#pragma unroll
    for (int c = 0; c < CPL; ++c) {
      P[c] += part[w][0][CPL * lane + c];
      Q[c] += part[w][1][CPL * lane + c];
    }
    kk += dots[w][0];
    qq += dots[w][1];
    kq += dots[w][2];
  }
  const float nk = a.l2_k ? rsqrtf(kk + a.eps_k) : 1.f;
  const float nq = (a.l2_q ? rsqrtf(qq + a.eps_q) : 1.f) * a.q_scale;
  V o, kd;
#pragma unroll
  for (int c = 0; c < CPL; ++c) {
    const float delta = bv * (cols(vj)[c] - decay * nk * P[c]);
    cols(o)[c] = decay * nq * Q[c] + delta * nk * nq * kq;
    cols(kd)[c] = nk * delta;
  }
  if (warp == 0) *reinterpret_cast<V*>(a.out + (m * a.Nv + h) * kDvFull + c0 + CPL * lane) = o;
  if (a.a && tid == 0 && blockIdx.z == 0) {  // as delta_kernel: the gates for the buffers' later readers
    a.g[m * a.Nv + h] = gv;
    a.beta[m * a.Nv + h] = bv;
  }
#pragma unroll
  for (int ii = 0; ii < kR; ++ii) {
    if (ii < R) {
      V n;
#pragma unroll
      for (int c = 0; c < CPL; ++c)
        cols(n)[c] = decay * cols(s[ii])[c] + kr[ii] * cols(kd)[c];
      *reinterpret_cast<V*>(Sg + (warp + W * ii) * kDvFull + CPL * lane) = n;
    }
  }
}

// delta_step_kernel's warps for d (Options::delta_step 8 / 4 where they divide Dk), 0: delta_kernel.
int delta_step_warps(const DeltaDesc& d) {
  return (d.step_warps == 8 || d.step_warps == 4) && d.Dk % d.step_warps == 0 ? d.step_warps : 0;
}

}  // namespace

bool delta_site_supported(const DeltaDesc& d, const SiteDesc& s) {
  return d.T == 1 && !d.rows && delta_step_warps(d) != 0 && s.pre == kPreGatedNorm && s.src == d.out && s.rows == 1 &&
         s.K == d.Nv * d.Dv && s.ld == s.K && aligned16(d.out) && site_row_supported(s);
}

bool delta_conv_supported(const DeltaDesc& d, const DeltaConvIn& c) {
  auto inside = [&](const float* p, int64_t n) { return p >= c.out && p + n <= c.out + c.C; };
  return d.T == 1 && !d.rows && delta_step_warps(d) == 8 && d.a && d.b && d.A && d.dt_bias && 2 * d.Dk <= 256 &&
         c.x && c.state && c.taps && c.out && c.wa && c.wb && c.dx && c.count && c.Kc >= 1 && c.Kc <= kMaxConvKernel &&
         inside(d.q, d.Nk * d.Dk) && inside(d.k, d.Nk * d.Dk) && inside(d.v, d.Nv * d.Dv) && c.E % 8 == 0 &&
         aligned16(c.dx) && aligned16(c.wa) && aligned16(c.wb);
}

bool delta_out_supported(const DeltaDesc& d) {
  if (!d.out_proj || !d.site || !delta_site_supported(d, *d.site) || delta_step_warps(d) != 8) return false;
  if (d.conv && !delta_conv_supported(d, *d.conv)) return false;
  const DeltaOutDesc& o = *d.out_proj;
  return (d.site->levels == 1 || d.site->levels == 2) && o.D >= 512 && o.D % 512 == 0 && o.D / 32 <= kDeltaOutMaxRows &&
         (d.Nv * d.Dv) % 1024 == 0 && o.words && o.scales && o.parts && o.flags && aligned16(o.words) &&
         aligned16(o.scales) && aligned16(o.parts);
}

namespace {
// The out-projection instance for (site levels, fused conv, bf16 a / b weights) and its dynamic shared memory.
const void* delta_out_kernel(int levels, bool conv, bool bf16) {
  if (levels == 2)
    return conv ? (bf16 ? reinterpret_cast<const void*>(&delta_step_kernel<8, 2, true, true, true>)
                        : reinterpret_cast<const void*>(&delta_step_kernel<8, 2, true, false, true>))
                : reinterpret_cast<const void*>(&delta_step_kernel<8, 2, false, false, true>);
  return conv ? (bf16 ? reinterpret_cast<const void*>(&delta_step_kernel<8, 1, true, true, true>)
                      : reinterpret_cast<const void*>(&delta_step_kernel<8, 1, true, false, true>))
              : reinterpret_cast<const void*>(&delta_step_kernel<8, 1, false, false, true>);
}
uint32_t delta_out_smem(int64_t D) { return uint32_t(D / 32 * (kDeltaOutRowBytes + 16)); }
}  // namespace

// The OUT instances' dynamic shared memory limit, and the whole carveout as shared memory (the residency rule's
// occupancy query and the launches then see the same split). Once per process.
void init_delta_out_attributes() {
  static const bool done = [] {
    for (int lv : {1, 2})
      for (int conv : {0, 1})
        for (int bf16 : {0, conv}) {
          const void* f = delta_out_kernel(lv, conv, bf16);
          if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(delta_out_smem(int64_t(32) * kDeltaOutMaxRows))) != cudaSuccess ||
              cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess)
            (void)cudaGetLastError();  // no device here (host-only tests): the launch itself would report it
        }
    return true;
  }();
  (void)done;
}

bool delta_out_resident(const DeltaDesc& d, int sms) {
  if (!delta_out_supported(d)) return false;
  init_delta_out_attributes();  // the query needs the raised shared memory limit (also without a backend, in tests)
  int per_sm = 0;
  const void* f = delta_out_kernel(d.site->levels, d.conv != nullptr, d.conv && d.conv->bf16);
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, 256, delta_out_smem(d.out_proj->D)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return int64_t(per_sm) * sms >= d.Nv * (d.Dv / 32);
}

namespace {
// The fused instance for (site levels LV, bf16 a / b weights).
template <int LV>
const void* delta_conv_kernel(bool bf16) {
  return bf16 ? reinterpret_cast<const void*>(&delta_step_kernel<8, LV, true, true>)
              : reinterpret_cast<const void*>(&delta_step_kernel<8, LV, true, false>);
}
}  // namespace

Launch delta_launch(const DeltaDesc& d) {
  DeltaArgs a{d.state,
              d.q,
              d.k,
              d.v,
              d.g,
              d.beta,
              d.out,
              d.a,
              d.b,
              d.A,
              d.dt_bias,
              d.T,
              d.Nk,
              d.Nv,
              d.Dk,
              d.Dv,
              d.ldq,
              d.ldk,
              d.ldv,
              d.l2_q,
              d.l2_k,
              d.eps_q,
              d.eps_k,
              d.q_scale,
              0,
              nullptr};
  // Batched rows keep delta_kernel: there the state traffic is the limit (B = 32: ~70 % of it), and delta_step_kernel's
  // registers (74 at 8 warps, 135 at 4, vs 64) leave fewer bytes in flight per SM: B = 32 measured 1,950 vs 2,206 tok/s.
  if (d.rows) {
    DeltaRowsArgs r{a, *d.rows};
    // Round 18: delta_rows_kernel (Options::delta_rows warps, 0 = delta_kernel) where Dv = 128 and W divides Dk.
    const int rw = d.rows_warps;
    bool vec = d.ldv % 4 == 0 && aligned16(d.v) && aligned16(d.out);
    for (int64_t m = 0; m < d.T; ++m) vec = vec && aligned16(d.rows->a[m]);
    if ((rw == 8 || rw == 16) && d.Dk % rw == 0 && d.Dv == 128 && vec) {
      // Round 22: rows_split column slices per state (1, 2 or 4; anything else runs 1).
      const int sp = d.rows_split == 2 || d.rows_split == 4 ? d.rows_split : 1;
      const dim3 grid(unsigned(d.Nv), unsigned(d.T), unsigned(sp));
      const void* f = rw == 8 ? (sp == 1   ? reinterpret_cast<const void*>(&delta_rows_kernel<8, 4>)
                                 : sp == 2 ? reinterpret_cast<const void*>(&delta_rows_kernel<8, 2>)
                                           : reinterpret_cast<const void*>(&delta_rows_kernel<8, 1>))
                              : (sp == 1   ? reinterpret_cast<const void*>(&delta_rows_kernel<16, 4>)
                                 : sp == 2 ? reinterpret_cast<const void*>(&delta_rows_kernel<16, 2>)
                                           : reinterpret_cast<const void*>(&delta_rows_kernel<16, 1>));
      return make_launch(f, grid, dim3(rw * 32), 0, r);
    }
    const dim3 grid(unsigned(d.Nv), unsigned(d.Dv / 32), unsigned(d.T));
    return make_launch(reinterpret_cast<const void*>(&delta_kernel<DeltaRowsArgs>), grid, dim3(kDeltaWarps * 32), 0, r);
  }
  // One decode token of one sequence: the one-barrier kernel with 8 warps (Options::delta_step 8 / 4, 0 = delta_kernel;
  // H200 tg128 +2.3 % at depth 0, +1.6 % at 8k over delta_kernel, round 14).
  const int sw = delta_step_warps(d);
  const dim3 grid(unsigned(d.Nv), unsigned(d.Dv / 32));
  if (d.out_proj) {  // round 31: the step, its site and the out projection
    if (!delta_out_supported(d))
      throw std::invalid_argument("delta_launch: the fused out projection needs delta_out_supported (the site fused on "
                                  "8 warps, D % 512 == 0 and <= 8,192, aligned words / scales / parts)");
    const SiteDesc& sd = *d.site;
    const DeltaSiteArgs x{a, site_prologue_of(sd), sd.dst, sd.xq, sd.xds, d.site_count, sd.K};
    const DeltaOutDesc& od = *d.out_proj;
    const DeltaOutArgs o{od.words, od.scales, od.parts, od.flags, od.D};
    const void* f = delta_out_kernel(sd.levels, d.conv != nullptr, d.conv && d.conv->bf16);
    const uint32_t smem = delta_out_smem(od.D);
    if (d.conv) {
      const DeltaConvIn& c = *d.conv;
      const DeltaConvArgs ca{c.x,  c.state, c.taps, c.wa,         c.wb,         c.dx,        c.count,
                             c.C,  c.Kc,    c.E,    d.q - c.out,  d.k - c.out,  d.v - c.out};
      if (sd.levels == 2) return make_launch(f, grid, dim3(256), smem, DeltaOutStepArgs<2, true>{{x, ca}, o});
      return make_launch(f, grid, dim3(256), smem, DeltaOutStepArgs<1, true>{{x, ca}, o});
    }
    if (sd.levels == 2) return make_launch(f, grid, dim3(256), smem, DeltaOutStepArgs<2, false>{x, o});
    return make_launch(f, grid, dim3(256), smem, DeltaOutStepArgs<1, false>{x, o});
  }
  if (d.conv) {  // round 29: with its conv and a / b pair
    const DeltaConvIn& c = *d.conv;
    if (!delta_conv_supported(d, c))
      throw std::invalid_argument("delta_launch: the fused conv needs delta_conv_supported (one decode token at 8 "
                                  "warps, the gates folded, q / k / v inside the conv output)");
    const DeltaConvArgs ca{c.x,  c.state, c.taps, c.wa,         c.wb,         c.dx,        c.count,
                           c.C,  c.Kc,    c.E,    d.q - c.out,  d.k - c.out,  d.v - c.out};
    if (d.site) {
      if (!delta_site_supported(d, *d.site))
        throw std::invalid_argument("delta_launch: the fused gated-norm site needs delta_site_supported");
      const SiteDesc& sd = *d.site;
      const DeltaSiteArgs x{a, site_prologue_of(sd), sd.dst, sd.xq, sd.xds, d.site_count, sd.K};
      if (sd.levels == 2) return make_launch(delta_conv_kernel<2>(c.bf16), grid, dim3(256), 0, DeltaConvStepArgs<2>{x, ca});
      return make_launch(delta_conv_kernel<1>(c.bf16), grid, dim3(256), 0, DeltaConvStepArgs<1>{x, ca});
    }
    return make_launch(delta_conv_kernel<0>(c.bf16), grid, dim3(256), 0, DeltaConvStepArgs<0>{a, ca});
  }
  if (d.site) {  // round 26: with the gated-norm site of out
    if (!delta_site_supported(d, *d.site))
      throw std::invalid_argument("delta_launch: the fused gated-norm site needs delta_site_supported (one decode "
                                  "token, the site of out on one row)");
    const SiteDesc& sd = *d.site;
    DeltaSiteArgs x{a, site_prologue_of(sd), sd.dst, sd.xq, sd.xds, d.site_count, sd.K};
    const bool q16 = sd.levels == 2;
    const void* f = sw == 8 ? (q16 ? reinterpret_cast<const void*>(&delta_step_kernel<8, 2>)
                                   : reinterpret_cast<const void*>(&delta_step_kernel<8, 1>))
                            : (q16 ? reinterpret_cast<const void*>(&delta_step_kernel<4, 2>)
                                   : reinterpret_cast<const void*>(&delta_step_kernel<4, 1>));
    return make_launch(f, grid, dim3(sw * 32), 0, x);
  }
  if (d.T == 1 && sw == 8) return make_launch(reinterpret_cast<const void*>(&delta_step_kernel<8>), grid, dim3(256), 0, a);
  if (d.T == 1 && sw == 4) return make_launch(reinterpret_cast<const void*>(&delta_step_kernel<4>), grid, dim3(128), 0, a);
  return make_launch(reinterpret_cast<const void*>(&delta_kernel<DeltaArgs>), grid, dim3(kDeltaWarps * 32), 0, a);
}

ChainKernel delta_chain_trace(Launch& l, uint64_t* trace, int64_t capacity) {
  // Every delta_step_kernel instance delta_launch picks; each one's argument starts with its DeltaArgs.
  static const void* const kSteps[] = {
      reinterpret_cast<const void*>(&delta_step_kernel<8>), reinterpret_cast<const void*>(&delta_step_kernel<4>),
      reinterpret_cast<const void*>(&delta_step_kernel<8, 1>), reinterpret_cast<const void*>(&delta_step_kernel<8, 2>),
      reinterpret_cast<const void*>(&delta_step_kernel<4, 1>), reinterpret_cast<const void*>(&delta_step_kernel<4, 2>),
      delta_conv_kernel<0>(false), delta_conv_kernel<0>(true), delta_conv_kernel<1>(false), delta_conv_kernel<1>(true),
      delta_conv_kernel<2>(false), delta_conv_kernel<2>(true), delta_out_kernel(1, false, false),
      delta_out_kernel(1, true, false), delta_out_kernel(1, true, true), delta_out_kernel(2, false, false),
      delta_out_kernel(2, true, false), delta_out_kernel(2, true, true)};
  using ConvStep = DeltaConvStepArgs<0>;
  using OutStep = DeltaOutStepArgs<2, true>;
  static_assert(offsetof(DeltaSiteArgs, a) == 0 && offsetof(ConvStep, s) == 0 && offsetof(OutStep, k) == 0,
                "DeltaArgs first in every step argument");
  if (!kBlockTraceCompiled || l.size < sizeof(DeltaArgs) || 3 * launch_blocks(l) > capacity ||
      std::find(std::begin(kSteps), std::end(kSteps), l.func) == std::end(kSteps))
    return ChainKernel::kNone;
  set_arg_field(l, &DeltaArgs::trace, trace);  // (the argument's first bytes: its DeltaArgs)
  return ChainKernel::kDeltaStep;
}

}  // namespace bonsai::cuda
