// The weight ring of the streaming probes (cluster_ffn_probe.cu, gdn_mixer_probe.cu; compiled on the device, not part of
// the build): ST slots of SB bytes in dynamic shared memory, filled by a producer warp's bulk copies and drained by NC
// consumer warps that XOR every 16-byte word (nothing else computed, so the stream is what is timed).
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

  // By thread 0, before a block barrier.
  __device__ void init() {
    for (int k = 0; k < ST; ++k) {
      bonsai::cuda::mbar_init(&full[k], 1);
      bonsai::cuda::mbar_init(&empty[k], NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
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
