// The weight ring of the streaming probes (cluster_ffn_probe.cu, gdn_mixer_probe.cu; compiled on the device, not part of
// the build): ST slots of SB bytes in dynamic shared memory, filled by a producer warp's bulk copies and drained by NC
// consumer warps that XOR every 16-byte word (nothing else computed, so the stream is what is timed); and how the probes
// split their bytes over blocks and meet in groups of blocks.
#pragma once
#include <cstdint>

#include "backend/cuda/mbarrier.cuh"

template <int ST, int SB, int NC>
struct ProbeRing {
  char* ring;       // [ST][SB]
  uint64_t* full;   // [ST] the slot's bytes landed
  uint64_t* empty;  // [ST] every consumer warp done with the slot
  int s = 0, issued = 0;
  unsigned ph = 0;

  // By every thread of the block at its start: the ring in the launch's dynamic shared memory (ST x SB bytes), its
  // mbarriers initialised by thread 0, then a block barrier.
  __device__ static ProbeRing start() {
    extern __shared__ __align__(128) char ring_smem[];  // [ST][SB]
    __shared__ uint64_t full_bars[ST], empty_bars[ST];
    if (threadIdx.x == 0) {
      for (int k = 0; k < ST; ++k) {
        bonsai::cuda::mbar_init(&full_bars[k], 1);
        bonsai::cuda::mbar_init(&empty_bars[k], NC);
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    return ProbeRing{ring_smem, full_bars, empty_bars};
  }
  // The producer's lane 0: [src, src + n) into the ring, stage by stage, as far ahead as free slots allow.
  __device__ void produce(const char* src, int64_t n) {
    for (int64_t c = 0; c < n; c += SB, ++issued) {
      if (issued >= ST) bonsai::cuda::mbar_wait(&empty[s], ph ^ 1u);
      const unsigned bytes = unsigned(n - c < SB ? n - c : SB);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      bonsai::cuda::mbar_expect_tx(&full[s], bytes);
      bonsai::cuda::bulk_load(ring + size_t(s) * SB, src + c, bytes, &full[s]);
      if (++s == ST) s = 0, ph ^= 1u;
    }
  }
  // Consumer warp cw (0 .. NC - 1): XORs words cw, cw + NC, ... of each of n bytes' stages into acc.
  __device__ unsigned consume(int64_t n, int cw, int lane, unsigned acc) {
    for (int64_t c = 0; c < n; c += SB) {
      bonsai::cuda::mbar_wait(&full[s], ph);
      const int words = int((n - c < SB ? n - c : SB) / 16);
      const uint4* st = reinterpret_cast<const uint4*>(ring + size_t(s) * SB);
      for (int i = cw * 32 + lane; i < words; i += 32 * NC) {
        const uint4 v = st[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncwarp();
      if (lane == 0) bonsai::cuda::mbar_arrive(&empty[s]);
      if (++s == ST) s = 0, ph ^= 1u;
    }
    return acc;
  }
};

// Part `i` of `parts` of [off, off + bytes), in 16-byte units.
__device__ __forceinline__ void part_of(int64_t off, int64_t bytes, int i, int parts, int64_t& lo, int64_t& n) {
  const int64_t q = bytes / 16;
  lo = off + 16 * (q * i / parts);
  n = 16 * (q * (i + 1) / parts - q * i / parts);
}

// Block b of B in G groups: its group b G / B, its rank r there and the group's size (group c holds blocks
// [ceil(c B / G), ceil((c + 1) B / G)), as the fused FFN's groups).
__device__ __forceinline__ void probe_group(int b, int B, int G, int& group, int& r, int& gsize) {
  group = int(int64_t(b) * G / B);
  const int b0 = int((int64_t(group) * B + G - 1) / G), b1 = int((int64_t(group + 1) * B + G - 1) / G);
  r = b - b0, gsize = b1 - b0;
}

// A group's software barrier among the NC consumer warps of each of its gsize blocks: one arrival a block on counter c
// (monotone over launches: the target is the next multiple of gsize) and a poll by the `poller` thread, between two
// barriers of the block's consumer warps. Every block must be resident (the probes launch one a SM).
template <int NC>
__device__ __forceinline__ void group_barrier(unsigned* c, int gsize, bool poller) {
  asm volatile("bar.sync 1, %0;" ::"r"(NC * 32) : "memory");
  if (poller) {
    __threadfence();
    const unsigned old = atomicAdd(c, 1u);
    const unsigned target = (old / unsigned(gsize) + 1u) * unsigned(gsize);
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(c) : "memory");
    } while (int(seen - target) < 0);
  }
  asm volatile("bar.sync 1, %0;" ::"r"(NC * 32) : "memory");
}
