// Two latencies that decide how a decode step should be cut into kernels (round 15, docs/cuda-kernels.md): the hop
// between two dependent kernels (programmatic launch: the next grid waits in griddepcontrol.wait until this one is
// done) and one grid-wide barrier inside a kernel (an arrival counter and a polling thread per block), both on one
// block per SM sized like matvec v7's (672 threads, ~200 KB of shared memory), doing no other work.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace bonsai::cuda {
namespace {

struct SyncProbeArgs {
  int32_t* count;  // hop: block 0 bumps count[0]; barrier: the arrival counter, zero before the launch
  int32_t rounds;  // barrier rounds
  int32_t pad_;
};

__global__ __launch_bounds__(kSyncProbeThreads, 1) void hop_kernel(const SyncProbeArgs a) {
  pdl_trigger();
  pdl_wait();
  if (blockIdx.x == 0 && threadIdx.x == 0) a.count[0] += 1;
}

__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// All blocks resident (one per SM, grid <= SMs). Round r: every block arrives once (after its threads meet), then
// thread 0 polls until all have; a trap after ~2^24 polls instead of a hang.
__global__ __launch_bounds__(kSyncProbeThreads, 1) void barrier_kernel(const SyncProbeArgs a) {
  const int nblk = int(gridDim.x);
  for (int r = 1; r <= a.rounds; ++r) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(a.count, 1);
      unsigned spins = 0;
      while (ld_acquire_gpu(a.count) < r * nblk)
        if (++spins > (1u << 24)) __trap();
    }
    __syncthreads();
  }
}

}  // namespace

Launch sync_probe_hop_launch(int32_t* count, int blocks, uint32_t smem) {
  return make_launch(reinterpret_cast<const void*>(&hop_kernel), dim3(unsigned(blocks)), dim3(kSyncProbeThreads), smem,
                     SyncProbeArgs{count, 0, 0});
}

Launch sync_probe_barrier_launch(int32_t* count, int rounds, int blocks, uint32_t smem) {
  return make_launch(reinterpret_cast<const void*>(&barrier_kernel), dim3(unsigned(blocks)), dim3(kSyncProbeThreads),
                     smem, SyncProbeArgs{count, rounds, 0});
}

void init_sync_probe_attributes() {
  for (const void* f : {reinterpret_cast<const void*>(&hop_kernel), reinterpret_cast<const void*>(&barrier_kernel)})
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSyncProbeSmem)) != cudaSuccess)
      (void)cudaGetLastError();
}

}  // namespace bonsai::cuda
