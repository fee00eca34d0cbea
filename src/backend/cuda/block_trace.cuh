// A block's event timeline for diagnostics (round 24's v7 timeline; round 36: the fused FFN's too): %globaltimer (ns)
// written at a block's events into trace[block * kV7TraceSlots + slot] (the slots in kernels.h). Compiled in only with
// -DBONSAI_V7_TRACE in CMAKE_CUDA_FLAGS: the dormant checks alone cost 0.7 % of a decode token (H200, tg128 221.3 vs
// 223.0 tok/s in one call), so the default kernels carry none.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace bonsai::cuda {

#ifdef BONSAI_V7_TRACE
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define BLOCK_TRACE_VALUE(trace, slot, v)                                               \
  do {                                                                                  \
    if (trace) (trace)[int64_t(blockIdx.x) * kV7TraceSlots + (slot)] = uint64_t(v); \
  } while (0)
#else
#define BLOCK_TRACE_VALUE(trace, slot, v) \
  do {                                    \
  } while (0)
#endif
#define BLOCK_TRACE(trace, slot) BLOCK_TRACE_VALUE(trace, slot, global_ns())

// Round 37: the decode chain's small kernels (the sites, the conv + a / b pair, the delta step) in the same buffer, three
// events a block packed at trace[3 * flat block + event] (ChainTraceEvent, kernels.h; the host writes them out in v7's
// slots 0 / 2 / 5), by thread 0: where the time between two products goes.
#ifdef BONSAI_V7_TRACE
#define CHAIN_TRACE(trace, ev)                                                                                   \
  do {                                                                                                           \
    if ((trace) && threadIdx.x == 0)                                                                             \
      (trace)[3 * (int64_t(blockIdx.x) + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z)) + \
              (ev)] = global_ns();                                                                               \
  } while (0)
#else
#define CHAIN_TRACE(trace, ev) \
  do {                         \
  } while (0)
#endif

// Whether the kernels were built with their timelines (the backend's BONSAI_CUDA_MV7_TRACE needs it).
constexpr bool kBlockTraceCompiled =
#ifdef BONSAI_V7_TRACE
    true;
#else
    false;
#endif

}  // namespace bonsai::cuda
