// Norms, RoPE, elementwise ops, copies, the embedding gather, the dense a/b projections, the GDN conv and
// gates, argmax and the bandwidth probe. All memory-light: written for few launches and coalesced access,
// not for tricks.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/block_trace.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gdn_inputs.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kThreads = 256;

// ---- rmsnorm / add_rmsnorm: one block per row (1024 threads: a decode row is 1-2 float4 per thread) ----
constexpr int kNormThreads = 1024;
struct NormArgs {
  const float* x;      // rmsnorm input (add: delta)
  float* h;            // add_rmsnorm: residual, updated in place; null for plain rmsnorm
  const float* gain;   // [n] or null
  float* out;
  int64_t rows, n;
  float eps;
  int32_t pad;
};

__global__ __launch_bounds__(kNormThreads) void norm_kernel(const NormArgs a) {
  __shared__ float red[32];
  pdl_trigger();
  // The gain is a model constant: this thread's first float4 of it is read before waiting on the producer
  // (its DRAM round trip overlaps the wait; it was evicted since the last token).
  const bool vec = (a.n & 3) == 0;
  const float4 g0 = vec && a.gain && threadIdx.x < a.n / 4 ? reinterpret_cast<const float4*>(a.gain)[threadIdx.x]
                                                          : make_float4(1.f, 1.f, 1.f, 1.f);
  pdl_wait();
  const int64_t r = blockIdx.x;
  const float* x = a.x + r * a.n;
  float* out = a.out + r * a.n;
  float* h = a.h ? a.h + r * a.n : nullptr;
  const float* src = h ? h : x;  // each thread re-reads only what it wrote itself
  float ss = 0.f;
  if (vec) {  // float4 path
    const int64_t n4 = a.n / 4;
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 v = reinterpret_cast<const float4*>(x)[i];
      if (h) {
        const float4 hv = reinterpret_cast<const float4*>(h)[i];
        v = make_float4(hv.x + v.x, hv.y + v.y, hv.z + v.z, hv.w + v.w);
        reinterpret_cast<float4*>(h)[i] = v;
      }
      ss += sq4(v);  // the cluster site (ternary.cu) replays this order
    }
    ss = block_sum(ss, red);
    const float rr = rsqrtf(ss / float(a.n) + a.eps);
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(src)[i];
      const float4 g = i == threadIdx.x ? g0
                       : a.gain       ? reinterpret_cast<const float4*>(a.gain)[i]
                                      : make_float4(1.f, 1.f, 1.f, 1.f);
      reinterpret_cast<float4*>(out)[i] = make_float4(v.x * rr * g.x, v.y * rr * g.y, v.z * rr * g.z, v.w * rr * g.w);
    }
    return;
  }
  if (h) {
    for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x) {
      const float v = h[i] + x[i];
      h[i] = v;
      ss += v * v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x) ss += x[i] * x[i];
  }
  ss = block_sum(ss, red);
  const float rr = rsqrtf(ss / float(a.n) + a.eps);
  for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x) out[i] = src[i] * rr * (a.gain ? a.gain[i] : 1.f);
}

// ---- per-head norms: one warp per row (head) -----------------------------------------------------
struct HeadNormArgs {
  const float* x;
  const float* z;      // gated: silu(z) factor
  const float* gain;
  float* out;
  int64_t rows, n;
  float eps;
  int32_t mode;        // 0 l2norm (x * rsqrt(sum + eps)), 1 gated rmsnorm
};

__global__ __launch_bounds__(kThreads) void head_norm_kernel(const HeadNormArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= a.rows) return;
  const float* x = a.x + r * a.n;
  float* out = a.out + r * a.n;
  float ss = 0.f;
  for (int64_t i = lane; i < a.n; i += 32) ss += x[i] * x[i];
  ss = warp_sum(ss);
  if (a.mode == 0) {
    const float rr = rsqrtf(ss + a.eps);
    for (int64_t i = lane; i < a.n; i += 32) out[i] = x[i] * rr;
  } else {
    const float rr = rsqrtf(ss / float(a.n) + a.eps);
    const float* z = a.z + r * a.n;
    for (int64_t i = lane; i < a.n; i += 32) out[i] = x[i] * rr * a.gain[i] * siluf_(z[i]);
  }
}

// ---- RoPE (NEOX), angle in double: positions reach 2^18 and an fp32 angle would be off by ~1e-2 rad --
struct RopeArgs {
  float* x;
  int64_t M, H, D, rot, p0;
  double theta;
};
using RopeRowsArgs = WithRows<RopeArgs>;  // batched decode: row m at t.pos[m]

template <class Args>
__global__ __launch_bounds__(kThreads) void rope_kernel(const Args args) {
  const RopeArgs& a = base_of(args);
  pdl_trigger();
  pdl_wait();
  const int64_t half = a.rot / 2;
  const int64_t total = a.M * a.H * half;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t i = idx % half, mh = idx / half, m = mh / a.H;
    int64_t pos = a.p0 + m;
    if constexpr (is_rows_v<Args>) pos = args.t.pos[m];
    const double angle = double(pos) * pow(a.theta, -2.0 * double(i) / double(a.rot));
    double s, c;
    sincos(angle, &s, &c);
    float* xh = a.x + mh * a.D;
    const float x0 = xh[i], x1 = xh[i + half];
    xh[i] = float(double(x0) * c - double(x1) * s);
    xh[i + half] = float(double(x0) * s + double(x1) * c);
  }
}

// Batched KV append: block (piece of the row, row m, k or v).
struct KvRowsArgs {
  const float* k;
  const float* v;
  int64_t M, row;
  RowTable t;
};
__global__ __launch_bounds__(kThreads) void kv_rows_kernel(const KvRowsArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t m = blockIdx.y;
  const bool is_v = blockIdx.z == 1;
  const float* src = (is_v ? a.v : a.k) + m * a.row;
  float* dst = (is_v ? a.t.b[m] : a.t.a[m]) + a.t.pos[m] * a.row;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < a.row; i += int64_t(gridDim.x) * kThreads)
    dst[i] = src[i];
}

// ---- elementwise ---------------------------------------------------------------------------------
struct EwArgs {
  float* out;
  const float* a;
  const float* b;
  int64_t n;
  float s;
  int32_t op;  // 0 scale (out = a * s), 1 sigmoid mul (out = a * sigmoid(b)), 2 silu mul (out = silu(a) * b), 3 zero
};

__global__ __launch_bounds__(kThreads) void ew_kernel(const EwArgs a) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < a.n; i += int64_t(gridDim.x) * kThreads) {
    float v;
    switch (a.op) {
      case 0: v = a.a[i] * a.s; break;
      case 1: v = a.a[i] * sigmoidf_(a.b[i]); break;
      case 2: v = siluf_(a.a[i]) * a.b[i]; break;
      default: v = 0.f; break;
    }
    a.out[i] = v;
  }
}

struct CopyArgs {
  float* dst;
  const float* src;
  const int32_t* perm;  // permute: dst[r][i] = src[r][perm[i]]
  int64_t ld_dst, ld_src, rows, cols;
};

__global__ __launch_bounds__(kThreads) void copy_kernel(const CopyArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t total = a.rows * a.cols;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t r = idx / a.cols, c = idx % a.cols;
    a.dst[r * a.ld_dst + c] = a.src[r * a.ld_src + (a.perm ? int64_t(a.perm[c]) : c)];
  }
}

// 16-byte form of a plain row copy (round 8b: the prefill's q / k / v splits; 8.3 us per 256 x 2048 copy with
// the element form's 64-bit div / mod per element). cols, ld_dst, ld_src multiples of 4, pointers 16-byte aligned.
__global__ __launch_bounds__(kThreads) void copy4_kernel(const CopyArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t c4 = a.cols / 4, total = a.rows * c4;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t r = idx / c4, c = idx - r * c4;
    *reinterpret_cast<float4*>(a.dst + r * a.ld_dst + 4 * c) =
        *reinterpret_cast<const float4*>(a.src + r * a.ld_src + 4 * c);
  }
}

// ---- embedding gather: one block per token, 16 codes per thread step -------------------------------
struct EmbedArgs {
  const uint32_t* words;
  const uint16_t* scales;
  const int32_t* ids_dev;
  float* out;
  int64_t K, M;
  int32_t ids[kInlineIds];
};

__global__ __launch_bounds__(kThreads) void embed_kernel(const EmbedArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t m = blockIdx.x;
  const int64_t id = a.ids_dev ? a.ids_dev[m] : a.ids[m];
  const uint32_t* w = a.words + id * (a.K / 16);
  const __half* s = reinterpret_cast<const __half*>(a.scales) + id * (a.K / 128);
  float* out = a.out + m * a.K;
  for (int64_t i = threadIdx.x; i < a.K / 16; i += kThreads) {
    const uint32_t word = w[i];
    const float d = __half2float(s[i / 8]);
    float4* o4 = reinterpret_cast<float4*>(out + i * 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t b = word >> (8 * k);
      o4[k] = make_float4(float(int(b & 3) - 1) * d, float(int((b >> 2) & 3) - 1) * d,
                          float(int((b >> 4) & 3) - 1) * d, float(int((b >> 6) & 3) - 1) * d);
    }
  }
}

// ---- dense: one warp per (output row), looping over tokens ----------------------------------------
struct DenseArgs {
  const void* w0;
  const void* w1;
  float* y0;
  float* y1;
  const float* x;
  int64_t N0, N1, K, M;
  int32_t bf16, pad;
};

template <bool BF16>
__device__ __forceinline__ float wload(const void* w, int64_t i) {
  if constexpr (BF16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(w)[i]);
  else return reinterpret_cast<const float*>(w)[i];
}


// Block per (output row, tile of kDenseToks tokens); the 8 warps split K (a decode a/b pair is 96 rows:
// 96 blocks instead of 12), each 8-weight load serves the tile's tokens; shared-memory reduce.
constexpr int kDenseToks = 8;

// Block (row, token tile): the body, also run by conv_dense_kernel's blocks past the conv's (trace: its chain events).
template <bool BF16>
__device__ __forceinline__ void dense_block(const DenseArgs& a, int64_t row, int64_t tile,
                                            [[maybe_unused]] uint64_t* trace = nullptr) {
  __shared__ float red[kThreads / 32][kDenseToks];
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool second = row >= a.N0;
  const int64_t n = second ? row - a.N0 : row, N = second ? a.N1 : a.N0;
  const void* w = second ? a.w1 : a.w0;
  // The weights are constants: prefetch this thread's part of the row into L2 before waiting on the
  // producer of x, so the DRAM reads overlap the wait (one 128-byte line per prefetch).
  {
    const char* wb = static_cast<const char*>(w) + n * a.K * (BF16 ? 2 : 4);
    for (int64_t off = int64_t(threadIdx.x) * 128; off < a.K * (BF16 ? 2 : 4); off += kThreads * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(wb + off));
  }
  pdl_wait();
  CHAIN_TRACE(trace, kChainWait);
  float* y = second ? a.y1 : a.y0;
  const int64_t m0 = tile * kDenseToks;
  const int mt = int(a.M - m0 < kDenseToks ? a.M - m0 : int64_t(kDenseToks));
  float s[kDenseToks];
#pragma unroll
  for (int m = 0; m < kDenseToks; ++m) s[m] = 0.f;
  if ((a.K & 7) == 0) {
    for (int64_t i = int64_t(threadIdx.x) * 8; i < a.K; i += kThreads * 8) {
      float f[8];
      wload8<BF16>(w, n * a.K + i, f);
#pragma unroll
      for (int m = 0; m < kDenseToks; ++m) {
        if (m < mt) {
          const float* x = a.x + (m0 + m) * a.K + i;
          const float4 x0 = *reinterpret_cast<const float4*>(x), x1 = *reinterpret_cast<const float4*>(x + 4);
          s[m] += dot8(f, x0, x1);
        }
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < a.K; i += kThreads) {
      const float wv = wload<BF16>(w, n * a.K + i);
#pragma unroll
      for (int m = 0; m < kDenseToks; ++m)
        if (m < mt) s[m] += wv * a.x[(m0 + m) * a.K + i];
    }
  }
#pragma unroll
  for (int m = 0; m < kDenseToks; ++m) {
    const float v = warp_sum(s[m]);
    if (lane == 0) red[warp][m] = v;
  }
  __syncthreads();
  if (threadIdx.x < mt) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < kThreads / 32; ++k) t += red[k][threadIdx.x];
    y[(m0 + threadIdx.x) * N + n] = t;
  }
}
template <bool BF16>
__global__ __launch_bounds__(kThreads) void dense_kernel(const DenseArgs a) {
  dense_block<BF16>(a, blockIdx.x, blockIdx.y);
}

// Prefill form (round 8b): block per (8 output rows, 8 tokens), so each x tile read from L2 serves 8 rows
// instead of 1 (the row-per-block form above re-read the tokens' x once per row: 64 us for the a/b pair of a
// 256-token chunk, 96 rows x 32 tiles x 160 KB of L2 reads). K % 8 == 0.
// 128 threads (4 warps): ~225 registers a thread (64 accumulators + 64 weights), so 256-thread blocks ran one per
// SM, 3 waves of 384 blocks, each thread only 2.5 steps of K = 5120 (47 us measured); 128: 2 per SM, 5 steps.
// Round 11, HOIST: each K step's x loads of all 8 tokens are issued before its FMAs (tokens past M read row m0,
// their sums are dropped), so a step is one L2 round trip, not one per token (the `m < mt` guard kept the
// compiler from hoisting them); the same FMAs in the same order: bit-identical. BONSAI_CUDA_DENSE_HOIST=0: off.
// H200, one call: 49.0 -> 24.0 us per launch (the a/b pair of a 256-token chunk), pp2048 4,349 / 4,352 vs 4,282 /
// 4,284 tok/s without it. 247 registers, no spills: still 2 blocks of 128 threads per SM.
constexpr int kDenseRows = 8, kDenseTileThreads = 128;
template <bool BF16, bool HOIST>
__global__ __launch_bounds__(kDenseTileThreads) void dense_tile_kernel(const DenseArgs a) {
  constexpr int kThreads = kDenseTileThreads;
  __shared__ float red[kThreads / 32][kDenseRows * kDenseToks];
  pdl_trigger();
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = int64_t(blockIdx.x) * kDenseRows, m0 = int64_t(blockIdx.y) * kDenseToks;
  const int mt = int(min(a.M - m0, int64_t(kDenseToks))), nr = int(min(a.N0 + a.N1 - r0, int64_t(kDenseRows)));
  const void* wr[kDenseRows];
#pragma unroll
  for (int e = 0; e < kDenseRows; ++e) {
    const int64_t row = min(r0 + e, a.N0 + a.N1 - 1);
    const bool second = row >= a.N0;
    const int64_t n = second ? row - a.N0 : row;
    wr[e] = static_cast<const char*>(second ? a.w1 : a.w0) + n * a.K * (BF16 ? 2 : 4);
  }
  float s[kDenseRows][kDenseToks];
#pragma unroll
  for (int e = 0; e < kDenseRows; ++e)
#pragma unroll
    for (int m = 0; m < kDenseToks; ++m) s[e][m] = 0.f;
  for (int64_t i = int64_t(threadIdx.x) * 8; i < a.K; i += kThreads * 8) {
    float w[kDenseRows][8];
#pragma unroll
    for (int e = 0; e < kDenseRows; ++e) wload8<BF16>(wr[e], i, w[e]);
    if constexpr (HOIST) {
      float4 xv[kDenseToks][2];
#pragma unroll
      for (int m = 0; m < kDenseToks; ++m) {
        const float* x = a.x + (m < mt ? m0 + m : m0) * a.K + i;
        xv[m][0] = *reinterpret_cast<const float4*>(x);
        xv[m][1] = *reinterpret_cast<const float4*>(x + 4);
      }
#pragma unroll
      for (int m = 0; m < kDenseToks; ++m) {
        const float4 x0 = xv[m][0], x1 = xv[m][1];
#pragma unroll
        for (int e = 0; e < kDenseRows; ++e)
          s[e][m] += w[e][0] * x0.x + w[e][1] * x0.y + w[e][2] * x0.z + w[e][3] * x0.w + w[e][4] * x1.x +
                     w[e][5] * x1.y + w[e][6] * x1.z + w[e][7] * x1.w;
      }
      continue;
    }
#pragma unroll
    for (int m = 0; m < kDenseToks; ++m) {
      if (m < mt) {
        const float* x = a.x + (m0 + m) * a.K + i;
        const float4 x0 = *reinterpret_cast<const float4*>(x), x1 = *reinterpret_cast<const float4*>(x + 4);
#pragma unroll
        for (int e = 0; e < kDenseRows; ++e)
          s[e][m] += w[e][0] * x0.x + w[e][1] * x0.y + w[e][2] * x0.z + w[e][3] * x0.w + w[e][4] * x1.x +
                     w[e][5] * x1.y + w[e][6] * x1.z + w[e][7] * x1.w;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kDenseRows; ++e)
#pragma unroll
    for (int m = 0; m < kDenseToks; ++m) {
      const float v = warp_sum(s[e][m]);
      if (lane == 0) red[warp][e * kDenseToks + m] = v;
    }
  __syncthreads();
  if (threadIdx.x < kDenseRows * kDenseToks) {
    const int e = threadIdx.x / kDenseToks, m = threadIdx.x % kDenseToks;
    if (e < nr && m < mt) {
      float t = 0.f;
#pragma unroll
      for (int k = 0; k < kThreads / 32; ++k) t += red[k][threadIdx.x];
      const int64_t row = r0 + e;
      const bool second = row >= a.N0;
      (second ? a.y1 : a.y0)[(m0 + m) * (second ? a.N1 : a.N0) + (second ? row - a.N0 : row)] = t;
    }
  }
}

// ---- GDN conv: one thread per channel, the Kc-1 window in registers -------------------------------
struct ConvArgs {
  const float* x;
  float* state;
  const float* taps;
  float* out;
  int64_t T, C, Kc;
  int64_t slice = 0;  // conv_seq4_kernel: tokens per warp slice (a multiple of 8)
};
using ConvRowsArgs = WithRows<ConvArgs>;  // batched decode: token m (grid.y) is row m's, state t.a[m]

// Block (channel block bx, token / row by): the body, also run by conv_dense_kernel's first blocks (trace: its chain
// events).
template <class Args>
__device__ __forceinline__ void conv_block(const Args& args, int64_t bx, int64_t by,
                                           [[maybe_unused]] uint64_t* trace = nullptr) {
  const ConvArgs& a = base_of(args);
  pdl_trigger();
  const int64_t c = bx * kThreads + threadIdx.x;
  // The taps are model constants: read before waiting on the producer (the DRAM round trip overlaps it).
  float tap[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) tap[j] = c < a.C && j < a.Kc ? a.taps[c * a.Kc + j] : 0.f;
  pdl_wait();
  CHAIN_TRACE(trace, kChainWait);
  if (c >= a.C) return;
  int64_t t0 = 0, t1 = a.T;  // tokens of this thread's sequence
  float* state = a.state;
  if constexpr (is_rows_v<Args>) {
    t0 = by;
    t1 = t0 + 1;
    state = args.t.a[t0];
  }
  const int P = int(a.Kc - 1);
  float win[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) win[j] = j < P ? state[j * a.C + c] : 0.f;
  for (int64_t t = t0; t < t1; ++t) {
    a.out[t * a.C + c] = conv_token(tap, win, a.x[t * a.C + c], P);
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < P) state[j * a.C + c] = win[j];
}
template <class Args>
__global__ __launch_bounds__(kThreads) void conv_kernel(const Args args) {
  conv_block(args, blockIdx.x, blockIdx.y);
}

// One decode token of one sequence: the conv (blocks [0, conv_blocks)) and the dense a/b pair that reads the
// normed x (the rest, a block per output row) in one launch: independent inputs, one kernel fewer on the
// decode chain per GDN layer (docs/cuda-kernels.md, round 9).
struct ConvDenseArgs {
  ConvArgs conv;
  DenseArgs dense;
  int64_t conv_blocks;
  uint64_t* trace;  // round 37, diagnostic: u64 [3 x blocks] chain events (CHAIN_TRACE), or null
};
template <bool BF16>
__global__ __launch_bounds__(kThreads) void conv_dense_kernel(const ConvDenseArgs a) {
  CHAIN_TRACE(a.trace, kChainStart);
  if (int64_t(blockIdx.x) < a.conv_blocks) conv_block(a.conv, blockIdx.x, 0, a.trace);
  else dense_block<BF16>(a.dense, int64_t(blockIdx.x) - a.conv_blocks, 0, a.trace);
  CHAIN_TRACE(a.trace, kChainDone);  // thread 0: a conv block's first channel always exists
}

// Round 22: a batched step's conv rows (blocks [0, conv_blocks x M): channel block, row) and its a / b pair
// (dense_block, the rest: output row, token tile) in one launch, as conv_dense_kernel at one token.
struct ConvDenseRowsArgs {
  ConvRowsArgs conv;
  DenseArgs dense;
  int64_t conv_blocks;  // channel blocks per row
  int64_t tiles;        // the dense pair's token tiles
};
template <bool BF16>
__global__ __launch_bounds__(kThreads) void conv_dense_rows_kernel(const ConvDenseRowsArgs a) {
  const int64_t b = blockIdx.x, nc = a.conv_blocks * a.conv.a.T;
  if (b < nc) conv_block(a.conv, b % a.conv_blocks, b / a.conv_blocks);
  else dense_block<BF16>(a.dense, (b - nc) / a.tiles, (b - nc) % a.tiles);
}

// One sequence of T tokens (prefill): block = 32 channels (lanes: coalesced rows) x 8 warps, warp w walks its
// own slice of ~T/8 tokens, its window read from x (or the old state before token 0). The old state is read
// by everyone before the barrier; warp 0 writes the new one (the last Kc-1 inputs) after it.
constexpr int kConvCh = 32;
__global__ __launch_bounds__(kThreads) void conv_seq_kernel(const ConvArgs a) {
  pdl_trigger();
  const int lane = threadIdx.x & 31, grp = threadIdx.x >> 5, groups = kThreads / 32;
  const int64_t c = int64_t(blockIdx.x) * kConvCh + lane;
  const bool ok = c < a.C;
  float tap[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) tap[j] = ok && j < a.Kc ? a.taps[c * a.Kc + j] : 0.f;
  pdl_wait();
  const int P = int(a.Kc - 1);
  const int64_t per = (a.T + groups - 1) / groups, t_begin = grp * per, t_end = min(a.T, t_begin + per);
  // input s of the sequence: s >= 0 is x row s, s in [-P, 0) is state row P + s
  auto in = [&](int64_t s) { return s >= 0 ? a.x[s * a.C + c] : a.state[(P + s) * a.C + c]; };
  float win[kMaxConvKernel], last[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    win[j] = ok && j < P && t_begin < t_end ? in(t_begin - P + j) : 0.f;
    last[j] = ok && grp == 0 && j < P ? in(a.T - P + j) : 0.f;  // the new state, read before anyone writes it
  }
  // Eight tokens' inputs loaded before any output is stored (x and out may alias as far as the compiler knows, so
  // it would not hoist the loads itself): one memory round trip per 8 tokens instead of per token (26 -> ~6 us).
  constexpr int kU = 8;
  if (ok)
    for (int64_t tb = t_begin; tb < t_end; tb += kU) {
      float xs[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) xs[u] = tb + u < t_end ? a.x[(tb + u) * a.C + c] : 0.f;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (tb + u >= t_end) break;
        a.out[(tb + u) * a.C + c] = conv_token(tap, win, xs[u], P);
      }
    }
  __syncthreads();  // every warp has read its window from the old state
  if (ok && grp == 0)
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < P) a.state[j * a.C + c] = last[j];
}

// Round 29, the prefill form of conv_seq_kernel: a lane takes 4 adjacent channels (16-byte loads and stores, a warp
// 512 B of a token row) and a warp a slice of kConv4Tok tokens; block = 128 channels x 8 slices, grid (C / 128,
// T / (8 kConv4Tok)). conv_seq_kernel had one channel a lane (128 B a warp and token row) and 320 blocks of T / 8
// tokens a warp at the 27b's C = 10,240: ~20 KB of loads in flight per SM, 124 us per 2,048-token launch (~1.4 TB/s of
// its 168 MB); this keeps 4x the bytes in flight a thread with the same 8-token unroll and more blocks (a slice of 32
// tokens, 16 or 8 where that leaves fewer than two blocks per SM: 640 blocks at 2,048 tokens, 320 at 512). The same
// FMAs in the same order per channel as conv_seq_kernel: bit-identical. Needs C % 4 == 0, 16-byte aligned x / out /
// state, T >= kConv4Tok (every slice's window starts in x or, for slice 0, in the old state; slices >= 8 > Kc - 1) and out not overlapping x:
// block y = 0 writes the new state (x's last Kc - 1 rows) after its own slice 0 has read the old one, and no other
// block reads the state.
// KM: the most taps of the instance (4: the models' Kc; 8: the rest), so the registers of a 4-tap conv hold only its
// window (two blocks per SM).
constexpr int kConv4Tok = 32;  // tokens per warp slice
template <int KM>
__global__ __launch_bounds__(kThreads, KM <= 4 ? 2 : 1) void conv_seq4_kernel(const ConvArgs a) {
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = (int64_t(blockIdx.x) * 32 + lane) * 4;  // channels c .. c + 3
  const bool ok = c < a.C;
  float4 tap[KM];  // tap[j]: the 4 channels' tap j (model constants: read before the wait)
#pragma unroll
  for (int j = 0; j < KM; ++j) {
    const bool on = ok && j < a.Kc;
    tap[j] = on ? make_float4(a.taps[c * a.Kc + j], a.taps[(c + 1) * a.Kc + j], a.taps[(c + 2) * a.Kc + j],
                              a.taps[(c + 3) * a.Kc + j])
                : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  pdl_wait();
  const int P = int(a.Kc - 1);
  const int64_t t_begin = (int64_t(blockIdx.y) * (kThreads / 32) + warp) * a.slice, t_end = min(a.T, t_begin + a.slice);
  // input s of the sequence: s >= 0 is x row s, s in [-P, 0) is state row P + s
  auto in = [&](int64_t s) {
    return *reinterpret_cast<const float4*>(s >= 0 ? a.x + s * a.C + c : a.state + (P + s) * a.C + c);
  };
  float4 win[KM];
#pragma unroll
  for (int j = 0; j < KM; ++j)
    win[j] = ok && j < P && t_begin < t_end ? in(t_begin - P + j) : make_float4(0.f, 0.f, 0.f, 0.f);
  // One channel's output: conv_seq_kernel's FMAs in its order.
  auto conv1 = [&](const float* tp, const float* wn, float xv) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < KM; ++j) {
      if (j < P) acc += tp[4 * j] * wn[4 * j];
      else if (j == P) acc += tp[4 * j] * xv;
    }
    return siluf_(acc);
  };
  constexpr int kU = 8;  // tokens' loads in flight before any store (x and out may alias as far as nvcc knows)
  if (ok)
    for (int64_t tb = t_begin; tb < t_end; tb += kU) {
      float4 xs[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) xs[u] = tb + u < t_end ? in(tb + u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (tb + u >= t_end) break;
        const float4 xv = xs[u];
        const float* tp = &tap[0].x;
        const float* wn = &win[0].x;
        float4 o;
        o.x = conv1(tp + 0, wn + 0, xv.x);
        o.y = conv1(tp + 1, wn + 1, xv.y);
        o.z = conv1(tp + 2, wn + 2, xv.z);
        o.w = conv1(tp + 3, wn + 3, xv.w);
        *reinterpret_cast<float4*>(a.out + (tb + u) * a.C + c) = o;
#pragma unroll
        for (int j = 0; j < KM; ++j) {
          if (j + 1 < P) win[j] = win[j + 1];
          else if (j + 1 == P) win[j] = xv;
        }
      }
    }
  if (blockIdx.y != 0) return;
  __syncthreads();  // slice 0 has read its window from the old state
  // The new state: x's last P rows (T >= P; this kernel writes only out, which does not overlap x).
  if (ok && warp == 0)
#pragma unroll
    for (int j = 0; j < KM; ++j)
      if (j < P) *reinterpret_cast<float4*>(a.state + j * a.C + c) = in(a.T - P + j);
}

struct GatesArgs {
  const float* a;
  const float* b;
  const float* A;
  const float* dt_bias;
  float* g;
  float* beta;
  int64_t T, Nv;
};

__global__ __launch_bounds__(kThreads) void gates_kernel(const GatesArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.T * a.Nv) return;
  const int64_t h = i % a.Nv;
  const float u = a.a[i] + a.dt_bias[h];
  const float sp = u > 20.f ? u : log1pf(expf(u));
  a.g[i] = a.A[h] * sp;
  a.beta[i] = 1.f / (1.f + expf(-a.b[i]));
}

// ---- argmax: lowest index among the maxima, NaN never wins ----------------------------------------

__device__ __forceinline__ void better(float& bv, int64_t& bi, float v, int64_t i) {
  // (v, i) beats (bv, bi): bv is NaN-free by construction; bi < 0 means empty
  if (isnan(v) || i < 0) return;
  if (bi < 0 || v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

// Split-K GEMM epilogue: y[j] = sum of the ks partials, in slice order.
struct SplitSumArgs {
  const float* part;
  float* y;
  int64_t stride, n;
  int32_t ks, pad;
};
__global__ __launch_bounds__(kThreads) void splitk_sum_kernel(const SplitSumArgs a) {
  pdl_trigger();
  pdl_wait();
  for (int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x; j < a.n; j += int64_t(gridDim.x) * kThreads) {
    float v = a.part[j];
    for (int k = 1; k < a.ks; ++k) v += a.part[k * a.stride + j];
    a.y[j] = v;
  }
}

// Round 11: the same sums on float4s (n, stride multiples of 4, 16-byte aligned rows; the prefill split-K products:
// ffn_down and the out projections at 256 tokens, ks = 3): the same additions in the same order, bit-identical.
// H200: 10.35 -> 7.8 us per launch in the pp2048 profile.
__global__ __launch_bounds__(kThreads) void splitk_sum4_kernel(const SplitSumArgs a) {
  pdl_trigger();
  pdl_wait();
  const float4* p = reinterpret_cast<const float4*>(a.part);
  const int64_t n4 = a.n >> 2, s4 = a.stride >> 2;
  for (int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x; j < n4; j += int64_t(gridDim.x) * kThreads) {
    float4 v = p[j];
    for (int k = 1; k < a.ks; ++k) {
      const float4 u = p[k * s4 + j];
      v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
    }
    reinterpret_cast<float4*>(a.y)[j] = v;
  }
}

// out[r] = argmax of x[r] [n] (lowest index on ties, NaN never wins, all-NaN -> 0). Grid (C, rows): block c of row r
// scans the r-th row's chunk c; with C > 1 each writes its best to part_v / part_i [rows, C] and the last of the row
// (counters [rows], left at zero) takes the best of the C partials. better() is a total order (value down, index up),
// so the result does not depend on which block comes last. One 1024-thread block per 248,320-entry row took ~32 us
// (one SM's loads); C = 64 spreads a batch-1 row over 64 SMs.
struct ArgmaxRowsArgs {
  const float* x;
  int32_t* out;
  float* part_v;
  int64_t* part_i;
  int32_t* counters;
  int64_t n;
};
__global__ __launch_bounds__(kArgmaxRowThreads) void argmax_rows_kernel(const ArgmaxRowsArgs a) {
  __shared__ float sv[kArgmaxRowThreads / 32];
  __shared__ int64_t si[kArgmaxRowThreads / 32];
  __shared__ bool last;
  pdl_trigger();
  pdl_wait();
  const int64_t row = blockIdx.y;
  const int C = int(gridDim.x), c = int(blockIdx.x);
  const float* x = a.x + row * a.n;
  const int64_t b = a.n * c / C, e = a.n * (c + 1) / C;  // this block's chunk [b, e)
  float bv = 0.f;
  int64_t bi = -1;
  for (int64_t i = b + threadIdx.x; i < e; i += kArgmaxRowThreads) better(bv, bi, x[i], i);
  // block reduction into thread 0 (also the merge of the partials below)
  auto reduce = [&]() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, bv, o);
      const int64_t i = __shfl_xor_sync(0xffffffffu, bi, o);
      better(bv, bi, v, i);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // sv / si free (a second reduce reuses them)
    if (lane == 0) {
      sv[warp] = bv;
      si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 1; w < kArgmaxRowThreads / 32; ++w) better(bv, bi, sv[w], si[w]);
  };
  reduce();
  if (C == 1) {
    if (threadIdx.x == 0) a.out[row] = int32_t(bi < 0 ? 0 : bi);
    return;
  }
  if (threadIdx.x == 0) {
    a.part_v[row * C + c] = bv;
    a.part_i[row * C + c] = bi;
    __threadfence();
    last = atomicAdd(&a.counters[row], 1) == C - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  bv = 0.f;
  bi = -1;
  if (int(threadIdx.x) < C) {
    bv = __ldcg(a.part_v + row * C + threadIdx.x);
    bi = __ldcg(a.part_i + row * C + threadIdx.x);
  }
  reduce();
  if (threadIdx.x == 0) {
    a.out[row] = int32_t(bi < 0 ? 0 : bi);
    a.counters[row] = 0;  // ready for the next launch (graph replays)
  }
}

// ---- streaming-read probe ------------------------------------------------------------------------
struct ProbeArgs {
  const uint4* buf;
  uint32_t* sink;
  int64_t n16;
};

__global__ __launch_bounds__(512) void probe_kernel(const ProbeArgs a) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * 512;
  int64_t i = int64_t(blockIdx.x) * 512 + threadIdx.x;
  for (; i + 3 * stride < a.n16; i += 4 * stride) {
    const uint4 v0 = ld_stream(a.buf + i), v1 = ld_stream(a.buf + i + stride);
    const uint4 v2 = ld_stream(a.buf + i + 2 * stride), v3 = ld_stream(a.buf + i + 3 * stride);
    acc ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w ^ v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^ v3.z ^ v3.w;
  }
  for (; i < a.n16; i += stride) {
    const uint4 v = ld_stream(a.buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x == 0) a.sink[blockIdx.x] = acc;
}

}  // namespace

Launch rmsnorm_launch(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  NormArgs a{x, nullptr, gain, out, rows, n, eps, 0};
  return make_launch(reinterpret_cast<const void*>(&norm_kernel), dim3(unsigned(rows)),
                     dim3(unsigned(norm_block_threads(n))), 0, a);
}

Launch add_rmsnorm_launch(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                          float* out) {
  NormArgs a{delta, h, gain, out, rows, n, eps, 0};
  return make_launch(reinterpret_cast<const void*>(&norm_kernel), dim3(unsigned(rows)),
                     dim3(unsigned(norm_block_threads(n))), 0, a);
}

Launch l2norm_launch(float* x, int64_t rows, int64_t hd, float eps) {
  HeadNormArgs a{x, nullptr, nullptr, x, rows, hd, eps, 0};
  return make_launch(reinterpret_cast<const void*>(&head_norm_kernel), dim3(blocks_for(rows, kThreads / 32)),
                     dim3(kThreads), 0, a);
}

Launch gated_rmsnorm_launch(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                            float* out) {
  HeadNormArgs a{o, z, gain, out, rows, Dv, eps, 1};
  return make_launch(reinterpret_cast<const void*>(&head_norm_kernel), dim3(blocks_for(rows, kThreads / 32)),
                     dim3(kThreads), 0, a);
}

Launch rope_launch(float* x, int64_t M, int64_t H, int64_t D, int64_t rot, int64_t p0, float theta) {
  RopeArgs a{x, M, H, D, rot, p0, double(theta)};
  return make_launch(reinterpret_cast<const void*>(&rope_kernel<RopeArgs>),
                     dim3(blocks_for(M * H * (rot / 2), kThreads, 4096)), dim3(kThreads), 0, a);
}

Launch rope_rows_launch(float* x, int64_t M, int64_t H, int64_t D, int64_t rot, const RowTable& t, float theta) {
  RopeRowsArgs r{{x, M, H, D, rot, 0, double(theta)}, t};
  return make_launch(reinterpret_cast<const void*>(&rope_kernel<RopeRowsArgs>),
                     dim3(blocks_for(M * H * (rot / 2), kThreads, 4096)), dim3(kThreads), 0, r);
}

Launch kv_write_rows_launch(const RowTable& t, const float* k, const float* v, int64_t M, int64_t row) {
  KvRowsArgs a{k, v, M, row, t};
  return make_launch(reinterpret_cast<const void*>(&kv_rows_kernel), dim3(blocks_for(row, kThreads), unsigned(M), 2),
                     dim3(kThreads), 0, a);
}

static Launch ew(float* out, const float* x, const float* y, int64_t n, float s, int op) {
  EwArgs a{out, x, y, n, s, op};
  return make_launch(reinterpret_cast<const void*>(&ew_kernel), dim3(blocks_for(n, kThreads, 8192)), dim3(kThreads), 0,
                     a);
}
Launch scale_launch(float* x, int64_t n, float s) { return ew(x, x, nullptr, n, s, 0); }
Launch sigmoid_mul_launch(float* x, const float* gate, int64_t n) { return ew(x, x, gate, n, 0.f, 1); }
Launch silu_mul_launch(const float* gate, const float* up, int64_t n, float* out) { return ew(out, gate, up, n, 0.f, 2); }
Launch zero_launch(float* x, int64_t n) { return ew(x, nullptr, nullptr, n, 0.f, 3); }

struct PartsSumArgs {
  const float* parts;  // [n_parts][n]
  float* out;          // [n]
  int64_t n_parts, n;
};
__global__ void parts_sum_kernel(const PartsSumArgs a) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = a.parts[i];
    for (int64_t p = 1; p < a.n_parts; ++p) v += a.parts[p * a.n + i];
    a.out[i] = v;
  }
}
Launch parts_sum_launch(const float* parts, int64_t n_parts, int64_t n, float* out) {
  const PartsSumArgs a{parts, out, n_parts, n};
  return make_launch(reinterpret_cast<const void*>(&parts_sum_kernel), dim3(blocks_for(n, kThreads)), dim3(kThreads), 0, a);
}

Launch copy_rows_launch(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  CopyArgs a{dst, src, nullptr, ld_dst, ld_src, rows, cols};
  if (cols % 4 == 0 && ld_dst % 4 == 0 && ld_src % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(src) % 16 == 0)
    return make_launch(reinterpret_cast<const void*>(&copy4_kernel), dim3(blocks_for(rows * cols / 4, kThreads, 8192)),
                       dim3(kThreads), 0, a);
  return make_launch(reinterpret_cast<const void*>(&copy_kernel), dim3(blocks_for(rows * cols, kThreads, 8192)),
                     dim3(kThreads), 0, a);
}

Launch permute_launch(const float* x, int64_t rows, int64_t K, const int32_t* perm, float* out) {
  CopyArgs a{out, x, perm, K, K, rows, K};
  return make_launch(reinterpret_cast<const void*>(&copy_kernel), dim3(blocks_for(rows * K, kThreads, 8192)),
                     dim3(kThreads), 0, a);
}

Launch embed_launch(const uint32_t* words, const uint16_t* scales, int64_t K, const int32_t* host_ids,
                    const int32_t* ids_dev, int64_t M, float* out) {
  EmbedArgs a{};
  a.words = words;
  a.scales = scales;
  a.ids_dev = ids_dev;
  a.out = out;
  a.K = K;
  a.M = M;
  if (!ids_dev)
    for (int64_t m = 0; m < M && m < kInlineIds; ++m) a.ids[m] = host_ids[m];
  return make_launch(reinterpret_cast<const void*>(&embed_kernel), dim3(unsigned(M)), dim3(kThreads), 0, a);
}

namespace {
// The dense pair's arguments (dense_launch and the two launches that fuse it with the conv).
DenseArgs dense_args(const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* x, int64_t M) {
  DenseArgs a{};
  a.w0 = outs[0].w;
  a.y0 = outs[0].y;
  a.N0 = outs[0].N;
  if (n_outs > 1) {
    a.w1 = outs[1].w;
    a.y1 = outs[1].y;
    a.N1 = outs[1].N;
  }
  a.x = x;
  a.K = K;
  a.M = M;
  a.bf16 = bf16;
  return a;
}
}  // namespace

Launch dense_launch(const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* x, int64_t M) {
  if (dense_mma_supported(outs, n_outs, bf16, K, x, M)) return dense_mma_launch(outs, n_outs, K, x, M);
  const DenseArgs a = dense_args(outs, n_outs, bf16, K, x, M);
  // Prefill chunks: row tiles (round 8b). A batched decode step (M <= 32) keeps a block per row: the tile grid
  // is then 12 x 4 blocks for the a/b pair (17.4 us at M = 32 on the H200, round 9), the row grid 96 x 4.
  if (M > 32 && K % 8 == 0) {
    const char* e = std::getenv("BONSAI_CUDA_DENSE_HOIST");  // round 11 A/B switch (default on); prefill only
    const bool hoist = !(e && e[0] == '0' && e[1] == 0);
    const void* f = bf16 ? (hoist ? reinterpret_cast<const void*>(&dense_tile_kernel<true, true>)
                                  : reinterpret_cast<const void*>(&dense_tile_kernel<true, false>))
                         : (hoist ? reinterpret_cast<const void*>(&dense_tile_kernel<false, true>)
                                  : reinterpret_cast<const void*>(&dense_tile_kernel<false, false>));
    return make_launch(f, dim3(unsigned((a.N0 + a.N1 + kDenseRows - 1) / kDenseRows), unsigned((M + kDenseToks - 1) / kDenseToks)),
                       dim3(kDenseTileThreads), 0, a);
  }
  const void* f = bf16 ? reinterpret_cast<const void*>(&dense_kernel<true>)
                       : reinterpret_cast<const void*>(&dense_kernel<false>);
  return make_launch(f, dim3(unsigned(a.N0 + a.N1), unsigned((M + kDenseToks - 1) / kDenseToks)), dim3(kThreads), 0,
                     a);
}

bool conv_seq4_supported(const float* x, const float* state, const float* out, int64_t T, int64_t C, int64_t Kc) {
  if (T < kConv4Tok) return false;  // decode rows and short chunks: conv_kernel / conv_seq_kernel
  const char* e = std::getenv("BONSAI_CUDA_CONV4");  // round 29 A/B switch (default on; read per prefill launch)
  if (e && e[0] == '0' && e[1] == 0) return false;
  const bool apart = out + T * C <= x || x + T * C <= out;
  return C % 4 == 0 && Kc >= 1 && Kc <= kMaxConvKernel && apart && aligned16(x) &&
         aligned16(out) && aligned16(state);
}

Launch gdn_conv_launch(const float* x, float* state, const float* taps, int64_t T, int64_t C, int64_t Kc, float* out) {
  ConvArgs a{x, state, taps, out, T, C, Kc};
  if (conv_seq4_supported(x, state, out, T, C, Kc)) {
    const int64_t cb = (C + 127) / 128;
    a.slice = kConv4Tok;
    while (a.slice > 8 && cb * ((T + 8 * a.slice - 1) / (8 * a.slice)) < 2 * 132) a.slice /= 2;
    if (const char* e = std::getenv("BONSAI_CUDA_CONV4_SLICE"); e && *e) {  // round 29 A/B: 8, 16, 32, 64
      const int64_t v = std::atoll(e);
      if (v >= 8 && v % 8 == 0 && v <= T) a.slice = v;
    }
    return make_launch(Kc <= 4 ? reinterpret_cast<const void*>(&conv_seq4_kernel<4>)
                               : reinterpret_cast<const void*>(&conv_seq4_kernel<kMaxConvKernel>),
                       dim3(unsigned(cb), unsigned((T + 8 * a.slice - 1) / (8 * a.slice))), dim3(kThreads), 0, a);
  }
  if (T > 1)  // round 8b: 145 us -> tokens split over the block's warps (one thread per channel walked all T)
    return make_launch(reinterpret_cast<const void*>(&conv_seq_kernel), dim3(unsigned((C + kConvCh - 1) / kConvCh)),
                       dim3(kThreads), 0, a);
  return make_launch(reinterpret_cast<const void*>(&conv_kernel<ConvArgs>), dim3(blocks_for(C, kThreads)),
                     dim3(kThreads), 0, a);
}

Launch gdn_conv_dense_launch(const float* x, float* state, const float* taps, int64_t C, int64_t Kc, float* out,
                             const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* dx) {
  ConvDenseArgs a{};
  a.conv = ConvArgs{x, state, taps, out, 1, C, Kc};
  a.dense = dense_args(outs, n_outs, bf16, K, dx, 1);
  a.conv_blocks = blocks_for(C, kThreads);
  const void* f = bf16 ? reinterpret_cast<const void*>(&conv_dense_kernel<true>)
                       : reinterpret_cast<const void*>(&conv_dense_kernel<false>);
  return make_launch(f, dim3(unsigned(a.conv_blocks + a.dense.N0 + a.dense.N1)), dim3(kThreads), 0, a);
}

Launch gdn_conv_dense_rows_launch(const float* x, const RowTable& t, const float* taps, int64_t M, int64_t C, int64_t Kc,
                                  float* out, const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* dx) {
  ConvDenseRowsArgs a{};
  a.conv = ConvRowsArgs{{x, nullptr, taps, out, M, C, Kc}, t};
  a.dense = dense_args(outs, n_outs, bf16, K, dx, M);
  const DenseArgs& d = a.dense;
  a.conv_blocks = blocks_for(C, kThreads);
  a.tiles = (M + kDenseToks - 1) / kDenseToks;
  const int64_t blocks = a.conv_blocks * M + (d.N0 + d.N1) * a.tiles;
  const void* f = bf16 ? reinterpret_cast<const void*>(&conv_dense_rows_kernel<true>)
                       : reinterpret_cast<const void*>(&conv_dense_rows_kernel<false>);
  return make_launch(f, dim3(unsigned(blocks)), dim3(kThreads), 0, a);
}

Launch gdn_conv_rows_launch(const float* x, const RowTable& t, const float* taps, int64_t M, int64_t C, int64_t Kc,
                            float* out) {
  ConvRowsArgs r{{x, nullptr, taps, out, M, C, Kc}, t};
  return make_launch(reinterpret_cast<const void*>(&conv_kernel<ConvRowsArgs>), dim3(blocks_for(C, kThreads), unsigned(M)),
                     dim3(kThreads), 0, r);
}

Launch gdn_gates_launch(const float* a_, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                        float* g, float* beta) {
  GatesArgs a{a_, b, A, dt_bias, g, beta, T, Nv};
  return make_launch(reinterpret_cast<const void*>(&gates_kernel), dim3(blocks_for(T * Nv, kThreads)), dim3(kThreads),
                     0, a);
}

Launch splitk_sum_launch(const float* part, int64_t stride, int ks, int64_t n, float* y) {
  SplitSumArgs a{part, y, stride, n, ks, 0};
  if (n % 4 == 0 && stride % 4 == 0 && reinterpret_cast<uintptr_t>(part) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0)
    return make_launch(reinterpret_cast<const void*>(&splitk_sum4_kernel), dim3(blocks_for(n / 4, kThreads)),
                       dim3(kThreads), 0, a);
  return make_launch(reinterpret_cast<const void*>(&splitk_sum_kernel), dim3(blocks_for(n, kThreads)), dim3(kThreads), 0,
                     a);
}

int argmax_rows_chunks(int64_t rows, int64_t n, int sms) {
  const int64_t by_size = (n + 4095) / 4096;             // >= 4 elements per thread
  const int64_t by_grid = std::max<int64_t>(1, 2 * sms / rows);  // about two waves' worth of blocks
  return int(std::clamp<int64_t>(std::min(by_size, by_grid), 1, kArgmaxRowMaxChunks));
}

Launch argmax_rows_launch(const float* x, int64_t rows, int64_t n, int32_t* out, int chunks, float* part_v,
                          int64_t* part_i, int32_t* counters) {
  ArgmaxRowsArgs a{x, out, part_v, part_i, counters, n};
  return make_launch(reinterpret_cast<const void*>(&argmax_rows_kernel), dim3(unsigned(chunks), unsigned(rows)),
                     dim3(kArgmaxRowThreads), 0, a);
}


Launch probe_launch(const void* buf, int64_t n16, uint32_t* sink, int blocks) {
  ProbeArgs a{reinterpret_cast<const uint4*>(buf), sink, n16};
  return make_launch(reinterpret_cast<const void*>(&probe_kernel), dim3(unsigned(blocks)), dim3(512), 0, a);
}

ChainKernel conv_dense_chain_trace(Launch& l, uint64_t* trace, int64_t capacity) {
  if (!kBlockTraceCompiled || l.size != sizeof(ConvDenseArgs) || 3 * launch_blocks(l) > capacity ||
      (l.func != reinterpret_cast<const void*>(&conv_dense_kernel<true>) &&
       l.func != reinterpret_cast<const void*>(&conv_dense_kernel<false>)))
    return ChainKernel::kNone;
  set_arg_field(l, &ConvDenseArgs::trace, trace);
  return ChainKernel::kConvDense;
}

}  // namespace bonsai::cuda
