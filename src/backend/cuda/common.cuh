// Device helpers shared by the kernels of the CUDA backend (nvcc only).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace bonsai::cuda {

// Programmatic dependent launch (sm_90). Every kernel calls pdl_trigger() then pdl_wait() before it
// reads or writes any activation, unconditionally and before any early return: that keeps "kernel N
// finished" implied by "kernel N+1 finished" along the whole chain. Without the launch attribute both
// are no-ops.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Spins until the int32 at p (written by other blocks of this launch) is at least want, with acquire semantics: what
// they released before it is visible after. A software barrier's poll assumes the blocks it waits for are resident
// (its callers check that); if one never comes (a GPU shared with another process, a debugger or a tool that holds
// blocks back), the poll traps after ~10 s instead of hanging: the launch fails with an error the host reports.
constexpr long long kPollTrapCycles = 20'000'000'000LL;  // ~10 s at the H200's 1.98 GHz SM clock
__device__ __forceinline__ void poll_until_at_least(const int32_t* p, int want) {
  const long long t0 = clock64();
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    if (v >= want) return;
    if (clock64() - t0 > kPollTrapCycles) __trap();
  }
}

// A software barrier's arrival: adds n at p with release semantics (gpu scope). Called by one thread after a barrier
// of the threads whose stores it publishes (bar.sync / bar.warp.sync order them before it, and a release is
// cumulative), it replaces a fence in every thread and a relaxed atomic; poll_until_at_least is its acquire.
__device__ __forceinline__ void red_release_add(int32_t* p, int n) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(n) : "memory");
}

// A last-arriver count (round 37): adds n at p with acq_rel semantics (gpu scope) and returns the old value, so the
// thread that completes a count sees what every earlier arriver published before its add (their releases), as
// red_release_add's arrival does for a poll. Called after a barrier of the threads whose stores it publishes.
__device__ __forceinline__ int atom_add_acq_rel(int32_t* p, int n) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(n) : "memory");
  return old;
}

// A software barrier's exit, after the poll of pair[0] above: counts this block out in pair[1]; the last of the n blocks
// to leave (every one past its poll) zeroes both, so the next launch finds them zero.
__device__ __forceinline__ void depart_and_reset(int32_t* pair, int n) {
  if (atomicAdd(pair + 1, 1) == n - 1) {
    atomicExch(pair, 0);
    atomicExch(pair + 1, 0);
  }
}

// A cache line into L2 (no register, no wait): before pdl_wait it overlaps a DRAM round trip with the wait for the
// producer, also for data other kernels write (L2 is where the SMs' writes meet).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); red: __shared__ float[32]. Every thread gets
// the total. Contains two __syncthreads.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}

// x^2 + y^2 + z^2 + w^2 with the roundings spelled out (no contraction left to the compiler): norm_kernel and
// the cluster site (ternary.cu) must sum a row's squares bit-identically.
__device__ __forceinline__ float sq4(float4 v) {
  return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.f + __expf(-x)); }

// 16-byte streaming load that skips L1 (weights are read once per token).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Batched-decode form of a kernel's argument struct A: A plus the per-row table (kernels.h, RowTable).
// A kernel templated on its argument type reads the shared fields through base_of() and the table only
// under `if constexpr (is_rows_v<Args>)`, so the single-sequence launch keeps its small arguments.
template <class A>
struct WithRows {
  A a;
  RowTable t;
};
template <class A>
__device__ __forceinline__ const A& base_of(const A& a) { return a; }
template <class A>
__device__ __forceinline__ const A& base_of(const WithRows<A>& r) { return r.a; }
template <class T>
inline constexpr bool is_rows_v = false;
template <class A>
inline constexpr bool is_rows_v<WithRows<A>> = true;

// Grid-stride helper bounds.
inline unsigned blocks_for(int64_t n, int threads, int64_t cap = 65535 * 4) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return unsigned(b);
}

// Cluster barrier halves (sm_90; site_kernel_cluster, site_row_norm_kernel): arrive.release publishes this block's
// shared-memory writes to the cluster, wait.acquire blocks until every block of the cluster has arrived. All threads
// of the block call both.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
// The arrive with no release fence: for "done reading your shared memory" (the reads already returned).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

}  // namespace bonsai::cuda
