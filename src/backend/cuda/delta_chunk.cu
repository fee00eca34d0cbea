// Chunked (WY / UT-transform) Gated DeltaNet delta rule for a prefill chunk (round 8b).
//
// The same function as delta_kernel (delta_rule.cu) and ref::gdn_chunked (FACTS.md section 6): per chunk of
// C = kDeltaChunk tokens of V head h, with Gamma the inclusive running sum of the log decays g inside the chunk,
//   A_rj = beta_r e^{Gamma_r - Gamma_j} k_r.k_j (j < r),  T = (I + A)^-1 (unit lower triangular),
//   W = T diag(beta e^Gamma) K,  U = T diag(beta) V,  V' = U - W S0,
//   O = (e^Gamma Q) S0 + P V' with P_rj = e^{Gamma_r - Gamma_j} q_r.k_j (j <= r),
//   S_C = e^{Gamma_C} S0 + (e^{Gamma_C - Gamma} K)^T V'.
// Every exponent is <= 0 (g <= 0), so nothing overflows. State S [Dk, Dv] per V head, fp32, row-major.
//
// Why two kernels: W, U, P and the decayed Q / K depend only on the chunk's own inputs, not on the state, so
// kernel 1 (delta_prep_kernel, grid (Nv, chunks)) builds them for every chunk at once; only the three state
// products (V', O, S_C) are sequential, in kernel 2 (delta_scan_kernel, grid (Nv, Dv/32): columns of S are
// independent, so each block carries a 32-column slice of one head's state through the chunks). Everything
// is fp32 FFMA from shared memory in these two (round 8b). Round 12's pair (delta_prep2_kernel, delta_scan2_kernel,
// the default; `mma` below) computes the same products on tensor cores in 3xTF32 (fp32-level accuracy) and the
// solve as one barrier-free forward substitution per column of W and U; same grids and scratch.
#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kC = int(kDeltaChunk);  // 64 tokens per chunk
constexpr int kThreads = 256;
constexpr int kMaxD = 128;            // Dk, Dv <= 128
constexpr int kLd = kMaxD + 1;        // prep: [C][<=128] tiles, rows one bank apart (column reads conflict-free)
constexpr int kLdC = kC + 1;          // prep: [C][C] tiles
constexpr int kLd4 = kMaxD + 4;       // scan: [C][<=128] tiles read as float4 along a row
constexpr int kLdP = kC + 4;          // scan: [C][C] tile read as float4
constexpr int kSW = 32;               // scan: state columns per block

struct DeltaChunkArgs {
  float* state;          // [Nv, Dk, Dv]
  float* q;              // [T, Nk, Dk] rows ldq floats apart (un-normalised when l2_q)
  float* k;              // [T, Nk, Dk] rows ldk apart
  const float* v;        // [T, Nv, Dv] rows ldv apart
  float* g;              // [T, Nv] log decays (written when a != null)
  float* beta;           // [T, Nv]
  float* out;            // [T, Nv, Dv]
  const float* a;        // [T, Nv] non-null: g, beta computed from a, b, A, dt_bias
  const float* b;
  const float* A;
  const float* dt_bias;
  float* scratch;        // [Nv, NC] blocks of per_block() floats (layout: scratch_off below)
  int64_t T, Nk, Nv, Dk, Dv, NC;
  int64_t ldq, ldk, ldv;
  int32_t l2_q, l2_k;
  float eps_q, eps_k, q_scale;
  int32_t pad;
};

// One (head, chunk) block of the scratch: W [C, Dk] | Qd = e^Gamma Q [C, Dk] | Kd = e^{Gamma_C - Gamma} K [C, Dk]
// | U [C, Dv] | P [C, C] | e^{Gamma_C} (+3 floats of padding: every piece stays 16-byte aligned).
__host__ __device__ inline int64_t per_block(int64_t Dk, int64_t Dv) { return kC * (3 * Dk + Dv) + kC * kC + 4; }

uint32_t prep_smem() { return uint32_t((2 * kC * kLd + 2 * kC * kLdC + 3 * kC) * sizeof(float)); }
uint32_t scan_smem() { return uint32_t((kMaxD * kSW + 2 * kC * kLd4 + kC * kLdP + kC * kSW) * sizeof(float)); }

// Steps 1-2 of both prep kernels: the chunk's q, k rows into Ks / QV ([C][LD], l2-normalised, q scaled), the gates
// (computed and written back when fused), Gamma, beta and beta e^Gamma into gam / bet / coef [C], e^{Gamma_C} to eLg.
// Ends with a barrier. DK: Dk at compile time (0: a.Dk).
template <int LD, int DK>
__device__ void chunk_inputs(const DeltaChunkArgs& a, int64_t h, int64_t t0, int L, float* Ks, float* QV, float* gam,
                             float* bet, float* coef, float* eLg) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t kh = h / (a.Nv / a.Nk);
  const int Dk = DK ? DK : int(a.Dk);
  // 1. q, k rows of the chunk (zero rows past the end: beta = 0 and g = 0 there make them inert), 4-byte cp.async
  // (the padded rows are not 16-byte aligned) so that all of a thread's copies are in flight at once.
  for (int idx = tid; idx < kC * Dk; idx += kThreads) {
    const int r = idx / Dk, i = idx % Dk;
    const int64_t tok = t0 + (r < L ? r : 0), col = kh * a.Dk + i;
    cp_async4(Ks + r * LD + i, a.k + tok * a.ldk + col, r < L ? 4 : 0);
    cp_async4(QV + r * LD + i, a.q + tok * a.ldq + col, r < L ? 4 : 0);
  }
  cp_async_commit();
  if (tid < kC) {
    float gv = 0.f, bv = 0.f;
    if (tid < L) {
      const int64_t gi = (t0 + tid) * a.Nv + h;
      if (a.a) {
        const float u = a.a[gi] + a.dt_bias[h];
        gv = a.A[h] * (u > 20.f ? u : log1pf(expf(u)));
        bv = 1.f / (1.f + expf(-a.b[gi]));
        a.g[gi] = gv;
        a.beta[gi] = bv;
      } else {
        gv = a.g[gi];
        bv = a.beta[gi];
      }
    }
    gam[tid] = gv;
    bet[tid] = bv;
  }
  cp_async_wait<0>();
  __syncthreads();
  // 2. l2-normalise (as delta_kernel: x * rsqrt(sum x^2 + eps)), q scale; warp w owns rows w, w + 8, ...
  for (int r = warp; r < kC; r += kThreads / 32) {
    if (a.l2_k) {
      float ss = 0.f;
      for (int i = lane; i < Dk; i += 32) ss += Ks[r * LD + i] * Ks[r * LD + i];
      const float f = rsqrtf(warp_sum(ss) + a.eps_k);
      for (int i = lane; i < Dk; i += 32) Ks[r * LD + i] *= f;
    }
    float f = a.q_scale;
    if (a.l2_q) {
      float ss = 0.f;
      for (int i = lane; i < Dk; i += 32) ss += QV[r * LD + i] * QV[r * LD + i];
      f *= rsqrtf(warp_sum(ss) + a.eps_q);
    }
    for (int i = lane; i < Dk; i += 32) QV[r * LD + i] *= f;
  }
  // Gamma: inclusive scan of g over the chunk (warp 0, two tokens per lane).
  if (warp == 0) {
    float v0 = gam[lane], v1 = gam[lane + 32];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float u0 = __shfl_up_sync(0xffffffffu, v0, o), u1 = __shfl_up_sync(0xffffffffu, v1, o);
      if (lane >= o) {
        v0 += u0;
        v1 += u1;
      }
    }
    v1 += __shfl_sync(0xffffffffu, v0, 31);
    gam[lane] = v0;
    gam[lane + 32] = v1;
    coef[lane] = bet[lane] * expf(v0);
    coef[lane + 32] = bet[lane + 32] * expf(v1);
    if (lane == 31) *eLg = expf(v1);
  }
  __syncthreads();
}

__global__ __launch_bounds__(kThreads) void delta_prep_kernel(const DeltaChunkArgs a) {
  extern __shared__ float sm[];
  float* Ks = sm;                // [C][kLd] k rows (normalised)
  float* QV = Ks + kC * kLd;     // [C][kLd] q rows, later v rows
  float* Am = QV + kC * kLd;     // [C][kLdC] A
  float* Tm = Am + kC * kLdC;    // [C][kLdC] T = (I + A)^-1
  float* gam = Tm + kC * kLdC;   // [C] Gamma
  float* bet = gam + kC;         // [C] beta
  float* coef = bet + kC;        // [C] beta e^Gamma
  pdl_trigger();
  pdl_wait();
  const int tid = threadIdx.x;
  const int64_t h = blockIdx.x, c = blockIdx.y;
  const int64_t t0 = c * kC;
  const int L = int(min(int64_t(kC), a.T - t0));
  const int Dk = int(a.Dk), Dv = int(a.Dv);
  float* blk = a.scratch + (h * a.NC + c) * per_block(a.Dk, a.Dv);
  float* Wg = blk;
  float* Qg = Wg + kC * Dk;
  float* Kg = Qg + kC * Dk;
  float* Ug = Kg + kC * Dk;
  float* Pg = Ug + kC * Dv;
  float* eLg = Pg + kC * kC;

  chunk_inputs<kLd, 0>(a, h, t0, L, Ks, QV, gam, bet, coef, eLg);

  // 3. A (into Am) and P (to global) from K K^T and Q K^T: thread tile rows ty + 16 a, columns tx + 16 b.
  const int tx = tid & 15, ty = tid >> 4;
  {
    float kk[4][4] = {}, qk[4][4] = {};
    for (int i = 0; i < Dk; ++i) {
      float kr[4], qr[4], kj[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        kr[e] = Ks[(ty + 16 * e) * kLd + i];
        qr[e] = QV[(ty + 16 * e) * kLd + i];
        kj[e] = Ks[(tx + 16 * e) * kLd + i];
      }
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          kk[e][f] += kr[e] * kj[f];
          qk[e][f] += qr[e] * kj[f];
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const int r = ty + 16 * e, j = tx + 16 * f;
        const float dec = j <= r ? expf(gam[r] - gam[j]) : 0.f;
        Am[r * kLdC + j] = j < r ? bet[r] * dec * kk[e][f] : 0.f;
        Pg[r * kC + j] = dec * qk[e][f];
      }
  }
  // Decayed Q (e^Gamma_r q_r) and K (e^{Gamma_C - Gamma_r} k_r) for the scan.
  for (int idx = tid; idx < kC * Dk; idx += kThreads) {
    const int r = idx / Dk, i = idx % Dk;
    Qg[idx] = QV[r * kLd + i] * expf(gam[r]);
    Kg[idx] = Ks[r * kLd + i] * expf(gam[kC - 1] - gam[r]);
  }
  __syncthreads();
  // v rows into QV (q is done: Qd and P are in global memory); they land during the solve.
  for (int idx = tid; idx < kC * Dv; idx += kThreads) {
    const int r = idx / Dv, j = idx % Dv;
    cp_async4(QV + r * kLd + j, a.v + (t0 + (r < L ? r : 0)) * a.ldv + h * a.Dv + j, r < L ? 4 : 0);
  }
  cp_async_commit();

  // 4. T = (I + A)^-1 by forward substitution, one row per step: T_rc = [r == c] - sum_{c <= j < r} A_rj T_jc.
  // Four threads per column c (consecutive lanes), each summing every fourth j.
  {
    const int cc = tid >> 2, part = tid & 3;
    for (int r = 0; r < kC; ++r) {
      float s = 0.f;
      if (cc < r)
        for (int j = cc + part; j < r; j += 4) s += Am[r * kLdC + j] * Tm[j * kLdC + cc];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (part == 0) Tm[r * kLdC + cc] = cc < r ? -s : (cc == r ? 1.f : 0.f);
      __syncthreads();
    }
  }
  cp_async_wait<0>();  // 5. the v rows
  __syncthreads();
  // 6. W = T diag(beta e^Gamma) K, U = T diag(beta) V; thread rows ty + 16 e, columns tx + 16 f.
  {
    float w[4][kMaxD / 16] = {}, u[4][kMaxD / 16] = {};
    for (int cc = 0; cc < kC; ++cc) {
      float tw[4], tu[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float t = Tm[(ty + 16 * e) * kLdC + cc];
        tw[e] = t * coef[cc];
        tu[e] = t * bet[cc];
      }
#pragma unroll
      for (int f = 0; f < kMaxD / 16; ++f) {
        const float kv = Ks[cc * kLd + tx + 16 * f], vv = QV[cc * kLd + tx + 16 * f];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          w[e][f] += tw[e] * kv;
          u[e][f] += tu[e] * vv;
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int f = 0; f < kMaxD / 16; ++f) {
        const int r = ty + 16 * e, i = tx + 16 * f;
        if (i < Dk) Wg[r * Dk + i] = w[e][f];
        if (i < Dv) Ug[r * Dv + i] = u[e][f];
      }
  }
}

__global__ __launch_bounds__(kThreads, 2) void delta_scan_kernel(const DeltaChunkArgs a) {
  extern __shared__ __align__(16) float sm[];
  float* S = sm;                     // [Dk][kSW] the state slice
  float* bufs = S + kMaxD * kSW;     // 2 x [C][kLd4]: W, Qd, Kd of chunk 0, 1, ... alternate (tile n in n & 1)
  float* Ps = bufs + 2 * kC * kLd4;  // [C][kLdP] P
  float* Vp = Ps + kC * kLdP;        // [C][kSW] V' = U - W S0
  pdl_trigger();
  pdl_wait();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t h = blockIdx.x, j0 = int64_t(blockIdx.y) * kSW;
  const int Dk = int(a.Dk), Dv = int(a.Dv), Dk4 = Dk / 4;
  float* Sg = a.state + h * a.Dk * a.Dv + j0;
  const int64_t per = per_block(a.Dk, a.Dv);
  const float* base = a.scratch + h * a.NC * per;
  // Tile [C, Dk] (row stride Dk in global) into a buffer (row stride kLd4) by cp.async, one commit group per
  // phase: the next phase's tile is in flight while this phase computes (double buffer).
  auto issue = [&](float* dst, const float* src) {
    for (int idx = tid; idx < kC * Dk4; idx += kThreads) {
      const int r = idx / Dk4, i4 = idx % Dk4;
      cp_async16(dst + r * kLd4 + 4 * i4, src + 4 * idx, 16);
    }
  };
  issue(bufs, base);  // W of chunk 0
  cp_async_commit();
  for (int idx = tid; idx < Dk * kSW; idx += kThreads) S[idx] = Sg[(idx / kSW) * a.Dv + idx % kSW];
  int cur = 0;  // buffer of the current tile
  for (int64_t c = 0; c < a.NC; ++c) {
    const float* blk = base + c * per;
    const float* Qg = blk + kC * Dk;
    const float* Kg = Qg + kC * Dk;
    const float* Ug = Kg + kC * Dk;
    const float* Pg = Ug + kC * Dv;
    const float eL = __ldcg(Pg + kC * kC);
    const int64_t t0 = c * kC;
    const int L = int(min(int64_t(kC), a.T - t0));
    // ---- phase A: V' = U - W S0 (lane = column, rows warp * 8 + e)
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = __ldcg(Ug + (warp * 8 + e) * Dv + j0 + lane);
    cp_async_wait<0>();
    __syncthreads();  // W landed; S written (chunk 0) / updated (phase C); the other buffer, Ps and Vp are free
    issue(bufs + (cur ^ 1) * kC * kLd4, Qg);
    for (int idx = tid; idx < kC * kC / 4; idx += kThreads) {
      const int r = idx / (kC / 4), j4 = idx % (kC / 4);
      cp_async16(Ps + r * kLdP + 4 * j4, Pg + 4 * idx, 16);
    }
    cp_async_commit();
    {
      const float* buf = bufs + cur * kC * kLd4;
      for (int i4 = 0; i4 < Dk4; ++i4) {
        const float s0 = S[(4 * i4) * kSW + lane], s1 = S[(4 * i4 + 1) * kSW + lane];
        const float s2 = S[(4 * i4 + 2) * kSW + lane], s3 = S[(4 * i4 + 3) * kSW + lane];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float4 w = *reinterpret_cast<const float4*>(buf + (warp * 8 + e) * kLd4 + 4 * i4);
          acc[e] -= w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) Vp[(warp * 8 + e) * kSW + lane] = acc[e];
    }
    cur ^= 1;
    // ---- phase B: O = Qd S0 + P V' (P is zero above the diagonal)
    cp_async_wait<0>();
    __syncthreads();  // Qd and P landed, V' complete, W's buffer free
    issue(bufs + (cur ^ 1) * kC * kLd4, Kg);
    cp_async_commit();
    {
      const float* buf = bufs + cur * kC * kLd4;
      float o[8] = {};
      for (int i4 = 0; i4 < Dk4; ++i4) {
        const float s0 = S[(4 * i4) * kSW + lane], s1 = S[(4 * i4 + 1) * kSW + lane];
        const float s2 = S[(4 * i4 + 2) * kSW + lane], s3 = S[(4 * i4 + 3) * kSW + lane];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float4 qd = *reinterpret_cast<const float4*>(buf + (warp * 8 + e) * kLd4 + 4 * i4);
          o[e] += qd.x * s0 + qd.y * s1 + qd.z * s2 + qd.w * s3;
        }
      }
      const int jmax = warp * 8 + 8;  // rows of this warp see V' rows < jmax
      for (int j4 = 0; j4 < jmax / 4; ++j4) {
        const float v0 = Vp[(4 * j4) * kSW + lane], v1 = Vp[(4 * j4 + 1) * kSW + lane];
        const float v2 = Vp[(4 * j4 + 2) * kSW + lane], v3 = Vp[(4 * j4 + 3) * kSW + lane];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float4 p = *reinterpret_cast<const float4*>(Ps + (warp * 8 + e) * kLdP + 4 * j4);
          o[e] += p.x * v0 + p.y * v1 + p.z * v2 + p.w * v3;
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int r = warp * 8 + e;
        if (r < L) a.out[((t0 + r) * a.Nv + h) * a.Dv + j0 + lane] = o[e];
      }
    }
    cur ^= 1;
    // ---- phase C: S = e^{Gamma_C} S0 + Kd^T V' (lane = column, state rows warp * 16 + e)
    cp_async_wait<0>();
    __syncthreads();  // Kd landed; every thread is done reading S, Qd, P
    if (c + 1 < a.NC) issue(bufs + (cur ^ 1) * kC * kLd4, blk + per);  // W of the next chunk
    cp_async_commit();
    if (warp * 16 < Dk) {
      const float* buf = bufs + cur * kC * kLd4;
      float u[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) u[e] = 0.f;
      for (int r = 0; r < kC; ++r) {
        const float vp = Vp[r * kSW + lane];
#pragma unroll
        for (int e4 = 0; e4 < 4; ++e4) {
          const float4 kd = *reinterpret_cast<const float4*>(buf + r * kLd4 + warp * 16 + 4 * e4);
          u[4 * e4] += kd.x * vp;
          u[4 * e4 + 1] += kd.y * vp;
          u[4 * e4 + 2] += kd.z * vp;
          u[4 * e4 + 3] += kd.w * vp;
        }
      }
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int i = warp * 16 + e;
        if (i < Dk) S[i * kSW + lane] = eL * S[i * kSW + lane] + u[e];
      }
    }
    cur ^= 1;
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int idx = tid; idx < Dk * kSW; idx += kThreads) Sg[(idx / kSW) * a.Dv + idx % kSW] = S[idx];
}

// ---- Round 12: the products on tensor cores (3xTF32), the solve one column per thread --------------------------
//
// mma.sync m16n8k8 with tf32 operands; each fp32 operand x is split as x = hi + lo (split_tf32) and a product taken
// as hi hi + lo hi + hi lo (the lo lo term is under fp32's rounding): fp32-level accuracy (3xTF32) at 3 mma per
// product. Fragments (PTX ISA, m16n8k8 .tf32; gid = lane / 4, tig = lane % 4): A a0 (gid, tig), a1 (gid + 8, tig),
// a2 (gid, tig + 4), a3 (gid + 8, tig + 4); B b0 (k tig, n gid), b1 (k tig + 4, n gid); C c0 / c1 (gid, 2 tig + 0 /
// 1), c2 / c3 (gid + 8, 2 tig + 0 / 1). Dk is a template parameter (64 or 128): the k loops unroll and the fragment
// addresses become constant offsets.
constexpr int kLdM = kMaxD + 4;  // [C][<=128] tiles read as A fragments (row gid, column tig): 32 distinct banks
constexpr int kLdA = kC + 4;     // [C][C] tiles: A fragments, and float4 rows in the solve
constexpr int kSW2 = 32;         // scan v2: state columns per block

// hi = x with its low 13 mantissa bits cleared (a tf32 value), lo = x - hi (exact in fp32); the mma reads a .tf32
// operand's top 19 bits, so lo enters truncated: |x - hi - lo'| < 2^-20 |x|. Two instructions; cvt.rna.tf32.f32
// compiles to five, and they took most of the issue slots of this pair's first version (round 12 notes).
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}
// A fragment at p = tile + (m0 + gid) * LD + k0 + tig of a row-major tile, split.
template <int LD>
__device__ __forceinline__ void frag_a(const float* p, uint32_t hi[4], uint32_t lo[4]) {
  split_tf32(p[0], hi[0], lo[0]);
  split_tf32(p[8 * LD], hi[1], lo[1]);
  split_tf32(p[4], hi[2], lo[2]);
  split_tf32(p[8 * LD + 4], hi[3], lo[3]);
}
// B fragment (k rows tig, tig + 4 below p's row, one column) of a tile with row stride LD, split.
template <int LD>
__device__ __forceinline__ void frag_b(const float* p, uint32_t hi[2], uint32_t lo[2]) {
  split_tf32(p[0], hi[0], lo[0]);
  split_tf32(p[4 * LD], hi[1], lo[1]);
}
// The three products of 3xTF32 in three accumulators (d[0] += ah bh, d[1] += al bh, d[2] += ah bl): three
// independent mma chains instead of one; sum3 adds them, the small terms first.
struct Acc3 {
  float d[3][4];
};
__device__ __forceinline__ void mma_tf32(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma3(Acc3& c, const uint32_t ah[4], const uint32_t al[4], const uint32_t bh[2],
                                     const uint32_t bl[2]) {
  mma_tf32(c.d[0], ah, bh);
  mma_tf32(c.d[1], al, bh);
  mma_tf32(c.d[2], ah, bl);
}
__device__ __forceinline__ float sum3(const Acc3& c, int e) { return c.d[0][e] + (c.d[1][e] + c.d[2][e]); }
// [rows][32] tiles read as B fragments (k = row, n = column), swizzled instead of padded (shared memory is tight):
// element (k, n) at k * 32 + (n ^ 8 (k % 4)), so the four k rows of a fragment hit four different 8-bank groups; a
// column pair (n even, n + 1) stays adjacent, and swz(k + 4 j, n) = swz(k, n) + 128 j.
__device__ __forceinline__ int swz(int k, int n) { return k * 32 + (n ^ ((k & 3) << 3)); }

// Lower-triangular (and diagonal) 16 x 8 tiles of a [C][C] product: m-tile mi has n-tiles 0 .. 2 mi + 1; 20 in all.
constexpr int kTriTiles = 20;
__device__ __forceinline__ void tri_tile(int t, int& mi, int& ni) {
  mi = t < 2 ? 0 : t < 6 ? 1 : t < 12 ? 2 : 3;
  ni = t - (mi == 0 ? 0 : mi == 1 ? 2 : mi == 2 ? 6 : 12);
}
// Rows 16 mi .. of X times rows 8 ni .. of K, transposed (a 16 x 8 tile of X K^T), over DK columns.
template <int DK>
__device__ __forceinline__ Acc3 tile_xkt(const float* X, const float* K, int mi, int ni, int gid, int tig) {
  Acc3 c = {};
  const float* pa = X + (16 * mi + gid) * kLdM + tig;
  const float* pb = K + (8 * ni + gid) * kLdM + tig;  // B (k, n) = K[n][k]
#pragma unroll
  for (int k0 = 0; k0 < DK; k0 += 8) {
    uint32_t ah[4], al[4], bh[2], bl[2];
    frag_a<kLdM>(pa + k0, ah, al);
    split_tf32(pb[k0], bh[0], bl[0]);
    split_tf32(pb[k0 + 4], bh[1], bl[1]);
    mma3(c, ah, al, bh, bl);
  }
  return c;
}

uint32_t prep2_smem() { return uint32_t((2 * kC * kLdM + kC * kLdA + 3 * kC) * sizeof(float)); }
uint32_t scan2_smem() { return uint32_t((kMaxD * kSW2 + 2 * kC * kLdM + kC * kLdA + kC * kSW2) * sizeof(float)); }

// Prep v2 (grid (Nv, chunks)): the same scratch as delta_prep_kernel. Q K^T and K K^T on tensor cores (only the 20
// lower tiles), then W = (I + A)^-1 diag(beta e^Gamma) K and U = (I + A)^-1 diag(beta) V by forward substitution,
// one column per thread (128 W columns, 128 U columns: no barrier inside the solve and no T matrix).
template <int DK>
__global__ __launch_bounds__(kThreads, 2) void delta_prep2_kernel(const DeltaChunkArgs a) {
  extern __shared__ __align__(16) float sm[];
  float* Ks = sm;                // [C][kLdM] k rows (normalised)
  float* QV = Ks + kC * kLdM;    // [C][kLdM] q rows, later v rows
  float* Am = QV + kC * kLdM;    // [C][kLdA] A (strictly lower; the solve reads j < r only)
  float* gam = Am + kC * kLdA;   // [C] Gamma
  float* bet = gam + kC;         // [C] beta
  float* coef = bet + kC;        // [C] beta e^Gamma
  pdl_trigger();
  pdl_wait();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int64_t h = blockIdx.x, c = blockIdx.y;
  const int64_t t0 = c * kC;
  const int L = int(min(int64_t(kC), a.T - t0));
  const int Dv = int(a.Dv);
  float* blk = a.scratch + (h * a.NC + c) * per_block(DK, a.Dv);
  float* Wg = blk;             // [C, DK]
  float* Qg = Wg + kC * DK;    // [C, DK]
  float* Kg = Qg + kC * DK;    // [C, DK]
  float* Ug = Kg + kC * DK;    // [C, Dv]
  float* Pg = Ug + kC * Dv;    // [C, C]
  float* eLg = Pg + kC * kC;   // [1]

  chunk_inputs<kLdM, DK>(a, h, t0, L, Ks, QV, gam, bet, coef, eLg);

  // 3. P = decay-masked Q K^T (to global; the scan reads whole 16-row blocks, so the upper tiles are written as 0)
  // and the decayed Q and K rows for the scan.
  for (int t = warp; t < kTriTiles; t += kThreads / 32) {
    int mi, ni;
    tri_tile(t, mi, ni);
    const Acc3 qk = tile_xkt<DK>(QV, Ks, mi, ni, gid, tig);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * mi + gid + 8 * (e >> 1), j = 8 * ni + 2 * tig + (e & 1);
      Pg[r * kC + j] = j <= r ? expf(gam[r] - gam[j]) * sum3(qk, e) : 0.f;
    }
  }
  for (int idx = tid; idx < kC * kC; idx += kThreads) {
    const int r = idx / kC, j = idx % kC;
    if (j / 8 > 2 * (r / 16) + 1) Pg[idx] = 0.f;
  }
  for (int r = warp; r < kC; r += kThreads / 32) {
    const float eq = expf(gam[r]), ek = expf(gam[kC - 1] - gam[r]);
    for (int i = lane; i < DK; i += 32) {
      Qg[r * DK + i] = QV[r * kLdM + i] * eq;
      Kg[r * DK + i] = Ks[r * kLdM + i] * ek;
    }
  }
  __syncthreads();
  // v rows into QV (q is done); they land during the K K^T tiles.
  for (int r = warp; r < kC; r += kThreads / 32) {
    const float* src = a.v + (t0 + (r < L ? r : 0)) * a.ldv + h * a.Dv;
    for (int j = lane; j < Dv; j += 32) cp_async4(QV + r * kLdM + j, src + j, r < L ? 4 : 0);
  }
  cp_async_commit();
  // 4. A_rj = beta_r e^{Gamma_r - Gamma_j} k_r.k_j (j < r) into Am.
  for (int t = warp; t < kTriTiles; t += kThreads / 32) {
    int mi, ni;
    tri_tile(t, mi, ni);
    const Acc3 kk = tile_xkt<DK>(Ks, Ks, mi, ni, gid, tig);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * mi + gid + 8 * (e >> 1), j = 8 * ni + 2 * tig + (e & 1);
      Am[r * kLdA + j] = j < r ? bet[r] * expf(gam[r] - gam[j]) * sum3(kk, e) : 0.f;
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  // 5. Forward substitution, thread = one column x of X = diag(beta e^Gamma) K (threads 0..127: W) or diag(beta) V
  // (128..255: U): x_r -= sum_{j < r} A_rj x_j, row by row, the column in registers (fully unrolled: A_r. is a
  // broadcast float4 read, the columns are independent, so there is no barrier).
  {
    const bool isU = tid >= kThreads / 2;
    const int i = tid % (kThreads / 2);
    if (i < (isU ? Dv : DK)) {
      const float* X = isU ? QV : Ks;
      const float* sc = isU ? bet : coef;
      float x[kC];
#pragma unroll
      for (int r = 0; r < kC; ++r) x[r] = sc[r] * X[r * kLdM + i];
#pragma unroll
      for (int r = 1; r < kC; ++r) {
        const float* ar = Am + r * kLdA;
        float s = x[r];
#pragma unroll
        for (int j = 0; j < r; j += 4) {
          const float4 av = *reinterpret_cast<const float4*>(ar + j);
          s -= av.x * x[j];
          if (j + 1 < r) s -= av.y * x[j + 1];
          if (j + 2 < r) s -= av.z * x[j + 2];
          if (j + 3 < r) s -= av.w * x[j + 3];
        }
        x[r] = s;
      }
      float* dst = isU ? Ug + i : Wg + i;
      const int ld = isU ? Dv : DK;
#pragma unroll
      for (int r = 0; r < kC; ++r) dst[r * ld] = x[r];
    }
  }
}

// Scan v2 (grid (Nv, Dv / 32)): per chunk, V' = U - W S0, O = Qd S0 + P V', S = e^{Gamma_C} S0 + Kd^T V' on tensor
// cores (3xTF32). The block's DK x 32 state slice lives in registers (fp32, C-fragment layout: warp w rows 16 w ..
// 16 w + 15, all 32 columns) and is mirrored into shared memory once per chunk for the B fragments of the next.
// Phases A and B: warp w owns rows 16 (w % 4) .., columns 16 (w / 4) ... Tiles double-buffered as in delta_scan_kernel.
template <int DK>
__global__ __launch_bounds__(kThreads, 2) void delta_scan2_kernel(const DeltaChunkArgs a) {
  extern __shared__ __align__(16) float sm[];
  float* S = sm;                     // [DK][32] swz: the state slice at the start of the chunk
  float* bufs = S + kMaxD * kSW2;    // 2 x [C][kLdM]: W, Qd, Kd of chunk 0, 1, ... alternate (tile n in n & 1)
  float* Ps = bufs + 2 * kC * kLdM;  // [C][kLdA] P
  float* Vp = Ps + kC * kLdA;        // [C][32] swz: V' = U - W S0
  pdl_trigger();
  pdl_wait();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int64_t h = blockIdx.x, j0 = int64_t(blockIdx.y) * kSW2;
  const int Dv = int(a.Dv);
  const int mA = 16 * (warp & 3), nA = 16 * (warp >> 2);  // phases A, B: this warp's rows and columns
  const bool owner = 16 * warp < DK;                       // phase C: this warp's 16 state rows exist
  // Fragment offsets (floats): A of W / Qd and of P (rows mA + gid), B of S / V' in phases A, B (columns nA + 8 nt +
  // gid) and of V' in phase C (columns 8 nt + gid), A of Kd^T (A (i, r) = Kd[r][i]: a transposed read, 2-way bank
  // conflicts). The k step k0 adds k0 (A, row-major), 32 k0 (B, swizzled) or kLdM k0 (Kd^T).
  const int offA = (mA + gid) * kLdM + tig, offP = (mA + gid) * kLdA + tig, offK = tig * kLdM + 16 * warp + gid;
  int offB[2], offC[4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) offB[nt] = swz(tig, nA + 8 * nt + gid);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) offC[nt] = swz(tig, 8 * nt + gid);
  float* Sg = a.state + h * DK * a.Dv + j0;
  const int64_t per = per_block(DK, a.Dv);
  const float* base = a.scratch + h * a.NC * per;
  auto issue = [&](float* dst, const float* src) {
    for (int idx = tid; idx < kC * DK / 4; idx += kThreads) {
      const int r = idx / (DK / 4), i4 = idx % (DK / 4);
      cp_async16(dst + r * kLdM + 4 * i4, src + 4 * idx, 16);
    }
  };
  issue(bufs, base);  // W of chunk 0
  cp_async_commit();
  // st[nt][e]: state row 16 warp + gid + 8 (e / 2), column 8 nt + 2 tig + e % 2.
  float st[4][4];
  if (owner) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = 16 * warp + gid + 8 * hr, n = 8 * nt + 2 * tig;
        const float2 v = *reinterpret_cast<const float2*>(Sg + int64_t(i) * a.Dv + n);
        st[nt][2 * hr] = v.x;
        st[nt][2 * hr + 1] = v.y;
        *reinterpret_cast<float2*>(S + swz(i, n)) = v;
      }
  }
  // acc[nt] += A S: A = this warp's 16 rows (kLdM-strided, k < DK) of W or Qd, S = the state's two 8-column tiles nt.
  auto rows_times_state = [&](const float* A, Acc3 (&acc)[2]) {
#pragma unroll
    for (int k0 = 0; k0 < DK; k0 += 8) {
      uint32_t ah[4], al[4];
      frag_a<kLdM>(A + k0, ah, al);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        uint32_t bh[2], bl[2];
        frag_b<32>(S + offB[nt] + 32 * k0, bh, bl);
        mma3(acc[nt], ah, al, bh, bl);
      }
    }
  };
  int cur = 0;
  for (int64_t c = 0; c < a.NC; ++c) {
    const float* blk = base + c * per;
    const float* Qg = blk + kC * DK;
    const float* Kg = Qg + kC * DK;
    const float* Ug = Kg + kC * DK;
    const float* Pg = Ug + kC * Dv;
    const float eL = __ldcg(Pg + kC * kC);
    const int64_t t0 = c * kC;
    const int L = int(min(int64_t(kC), a.T - t0));
    // ---- phase A: V' = U - W S0
    float u[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(Ug + (mA + gid + 8 * hr) * Dv + j0 + nA + 8 * nt +
                                                                2 * tig));
        u[nt][2 * hr] = v.x;
        u[nt][2 * hr + 1] = v.y;
      }
    cp_async_wait<0>();
    __syncthreads();  // W landed; S written (chunk 0) / updated (phase C); the other buffer, Ps and Vp are free
    issue(bufs + (cur ^ 1) * kC * kLdM, Qg);
    for (int idx = tid; idx < kC * kC / 4; idx += kThreads) {
      const int r = idx / (kC / 4), j4 = idx % (kC / 4);
      cp_async16(Ps + r * kLdA + 4 * j4, Pg + 4 * idx, 16);
    }
    cp_async_commit();
    {
      Acc3 ws[2] = {};
      rows_times_state(bufs + cur * kC * kLdM + offA, ws);  // W S0
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          *reinterpret_cast<float2*>(Vp + swz(mA + gid + 8 * hr, nA + 8 * nt + 2 * tig)) =
              make_float2(u[nt][2 * hr] - sum3(ws[nt], 2 * hr), u[nt][2 * hr + 1] - sum3(ws[nt], 2 * hr + 1));
    }
    cur ^= 1;
    // ---- phase B: O = Qd S0 + P V' (P is zero right of this warp's 16-row diagonal block)
    cp_async_wait<0>();
    __syncthreads();  // Qd and P landed, V' complete, W's buffer free
    issue(bufs + (cur ^ 1) * kC * kLdM, Kg);
    cp_async_commit();
    {
      Acc3 o[2] = {};
      rows_times_state(bufs + cur * kC * kLdM + offA, o);  // Qd S0
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 8) {
        if (k0 >= mA + 16) break;
        uint32_t ah[4], al[4];
        frag_a<kLdA>(Ps + offP + k0, ah, al);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          uint32_t bh[2], bl[2];
          frag_b<32>(Vp + offB[nt] + 32 * k0, bh, bl);
          mma3(o[nt], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = mA + gid + 8 * hr;
        if (r < L)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
            *reinterpret_cast<float2*>(a.out + ((t0 + r) * a.Nv + h) * a.Dv + j0 + nA + 8 * nt + 2 * tig) =
                make_float2(sum3(o[nt], 2 * hr), sum3(o[nt], 2 * hr + 1));
      }
    }
    cur ^= 1;
    // ---- phase C: S = e^{Gamma_C} S0 + Kd^T V'
    cp_async_wait<0>();
    __syncthreads();  // Kd landed; every thread is done reading S, Qd, P
    if (c + 1 < a.NC) issue(bufs + (cur ^ 1) * kC * kLdM, blk + per);  // W of the next chunk
    cp_async_commit();
    if (owner) {
      const float* Kd = bufs + cur * kC * kLdM + offK;
      Acc3 sn[4] = {};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sn[nt].d[0][e] = eL * st[nt][e];
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 8) {
        uint32_t ah[4], al[4];
        const float* p = Kd + k0 * kLdM;
        split_tf32(p[0], ah[0], al[0]);
        split_tf32(p[8], ah[1], al[1]);
        split_tf32(p[4 * kLdM], ah[2], al[2]);
        split_tf32(p[4 * kLdM + 8], ah[3], al[3]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t bh[2], bl[2];
          frag_b<32>(Vp + offC[nt] + 32 * k0, bh, bl);
          mma3(sn[nt], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nt][e] = sum3(sn[nt], e);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          *reinterpret_cast<float2*>(S + swz(16 * warp + gid + 8 * hr, 8 * nt + 2 * tig)) =
              make_float2(st[nt][2 * hr], st[nt][2 * hr + 1]);
      }
    }
    cur ^= 1;
  }
  cp_async_wait<0>();
  if (owner) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *reinterpret_cast<float2*>(Sg + int64_t(16 * warp + gid + 8 * hr) * a.Dv + 8 * nt + 2 * tig) =
            make_float2(st[nt][2 * hr], st[nt][2 * hr + 1]);
  }
}

}  // namespace

size_t delta_chunk_scratch_floats(int64_t T, int64_t Nv, int64_t Dk, int64_t Dv) {
  const int64_t NC = (T + kC - 1) / kC;
  return size_t(Nv * NC * per_block(Dk, Dv));
}

void init_delta_chunk_attributes() {
  cudaFuncSetAttribute(reinterpret_cast<const void*>(&delta_prep_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(prep_smem()));
  cudaFuncSetAttribute(reinterpret_cast<const void*>(&delta_scan_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(scan_smem()));
  for (const void* f : {reinterpret_cast<const void*>(&delta_prep2_kernel<64>),
                        reinterpret_cast<const void*>(&delta_prep2_kernel<128>)})
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prep2_smem()));
  for (const void* f : {reinterpret_cast<const void*>(&delta_scan2_kernel<64>),
                        reinterpret_cast<const void*>(&delta_scan2_kernel<128>)})
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(scan2_smem()));
}

void delta_chunk_launches(const DeltaDesc& d, float* scratch, bool mma, Launch out[2]) {
  const int64_t NC = (d.T + kC - 1) / kC;
  DeltaChunkArgs a{d.state,
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
                   scratch,
                   d.T,
                   d.Nk,
                   d.Nv,
                   d.Dk,
                   d.Dv,
                   NC,
                   d.ldq,
                   d.ldk,
                   d.ldv,
                   d.l2_q,
                   d.l2_k,
                   d.eps_q,
                   d.eps_k,
                   d.q_scale,
                   0};
  if (mma && (d.Dk == 128 || d.Dk == 64)) {
    const bool k128 = d.Dk == 128;
    out[0] = make_launch(k128 ? reinterpret_cast<const void*>(&delta_prep2_kernel<128>)
                              : reinterpret_cast<const void*>(&delta_prep2_kernel<64>),
                         dim3(unsigned(d.Nv), unsigned(NC)), dim3(kThreads), prep2_smem(), a);
    out[1] = make_launch(k128 ? reinterpret_cast<const void*>(&delta_scan2_kernel<128>)
                              : reinterpret_cast<const void*>(&delta_scan2_kernel<64>),
                         dim3(unsigned(d.Nv), unsigned(d.Dv / kSW2)), dim3(kThreads), scan2_smem(), a);
    return;
  }
  out[0] = make_launch(reinterpret_cast<const void*>(&delta_prep_kernel), dim3(unsigned(d.Nv), unsigned(NC)),
                       dim3(kThreads), prep_smem(), a);
  out[1] = make_launch(reinterpret_cast<const void*>(&delta_scan_kernel), dim3(unsigned(d.Nv), unsigned(d.Dv / kSW)),
                       dim3(kThreads), scan_smem(), a);
}

}  // namespace bonsai::cuda
