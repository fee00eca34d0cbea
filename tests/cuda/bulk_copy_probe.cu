// One SM's cp.async.bulk rate against copy size, copies per stage, ring depth and issuing lanes (round 23; not part of
// the build: compiled and run on the device by `nvcc -O3 -arch=sm_90a -std=c++17 -Isrc tests/cuda/bulk_copy_probe.cu
// -o /tmp/bcp && /tmp/bcp`, device_round21.sh BULK_PROBE=1). The barriers and copies are the kernels' own
// (backend/cuda/mbarrier.cuh), so the probe issues the instructions they do.
//
// Why: round 23's decode-attention ring streamed 1 KB row copies at ~1.65 TB/s with nothing computed (41 us for 67 MB,
// ~12.5 GB/s per SM with up to 198 KB outstanding), and matvec v7, fed by a few large bulk copies per stage, waits for
// its bytes with DRAM at ~53-62 %; the read probe (plain loads) reaches ~4.5 TB/s. This separates the copy engine's
// rate from the kernels: one block per SM, a producer warp issuing ring stages of `copies` copies of `size` bytes, a
// consumer warp that only waits for each stage and frees it. `group` > 1: the blocks of a group read interleaved
// size-byte rows (row r of block b at (r x group + b % group) x size, as the KV heads of a cache row), else contiguous.
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

#include "backend/cuda/mbarrier.cuh"
#include "probe_util.cuh"

using namespace bonsai::cuda;

struct Cfg {
  int size, copies, stages, issuers, group, blocks_per_sm;
  int waiters = 0;  // consumer warps whose 32 lanes all spin on `full` (as in the kernels); 0 = one lane of one warp
  int kb = 0;       // KB a block reads (a short stream, as decode attention's 514 KB per SM at 8k); 0 = its share of all
};

// Block b reads `rows` rows of `size` bytes. Dynamic shared memory: stages x copies x size.
__global__ __launch_bounds__(672) void bulk_stream(const char* src, int64_t rows, Cfg c, int* sink) {
  extern __shared__ __align__(128) char ring[];
  __shared__ uint64_t full[16], empty[16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < c.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], unsigned(c.waiters > 0 ? c.waiters : 1));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t tiles = rows / c.copies, stage = int64_t(c.copies) * c.size;
  const int64_t b = blockIdx.x, gb = b / c.group, gi = b % c.group;
  if (warp == 0) {
    for (int64_t i = 0; i < tiles; ++i) {
      const int s = int(i % c.stages);
      if (i >= c.stages) mbar_wait(&empty[s], uint32_t((i / c.stages - 1) & 1));
      if (lane == 0) mbar_expect_tx(&full[s], unsigned(stage));
      __syncwarp();
      for (int j = lane; lane < c.issuers && j < c.copies; j += c.issuers) {
        const int64_t r = gb * rows + i * c.copies + j;
        bulk_load(ring + s * stage + int64_t(j) * c.size, src + (r * c.group + gi) * c.size, unsigned(c.size), &full[s]);
      }
    }
  } else if (c.waiters > 0 || lane == 0) {
    int acc = 0;
    for (int64_t i = 0; i < tiles; ++i) {
      const int s = int(i % c.stages);
      mbar_wait(&full[s], uint32_t((i / c.stages) & 1));
      acc += ring[s * stage + lane];
      __syncwarp(__activemask());
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    if (acc == 123456789) *sink = acc;  // never: keeps the read
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr size_t kBytes = size_t(2) << 30;  // 2 GiB, ~40x the L2
  char* buf;
  int* sink;
  CK(cudaMalloc(&buf, kBytes));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(buf, 1, kBytes));
  CK(cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto best_ms = [&](auto launch) {
    float best = 1e30f;
    for (int rep = 0; rep < 4; ++rep) {
      cudaEventRecord(e0);
      launch();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (rep > 0 && ms < best) best = ms;  // rep 0 warms up
    }
    return best;
  };
  {
    const float ms = best_ms([&] {
      read_only<<<sms * 8, 256>>>(reinterpret_cast<float4*>(buf), kBytes / 16, reinterpret_cast<float*>(sink));
    });
    std::printf("plain loads (grid-stride float4, %d x 256 threads): %.0f GB/s\n", sms * 8, kBytes / (ms * 1e6));
  }
  const Cfg cfgs[] = {
      {1024, 64, 3, 32, 4, 1},  {1024, 64, 3, 32, 1, 1}, {1024, 64, 3, 1, 1, 1},   {1024, 32, 3, 32, 1, 2},
      {1024, 16, 12, 32, 1, 1}, {4096, 16, 3, 16, 1, 1}, {16384, 4, 3, 4, 1, 1},   {16384, 4, 3, 1, 1, 1},
      {65536, 1, 3, 1, 1, 1},   {32768, 1, 6, 1, 1, 1},  {32768, 1, 3, 1, 1, 2},   {8192, 4, 3, 4, 1, 2},
      {1024, 32, 3, 32, 1, 1},  {1024, 128, 1, 32, 1, 1}, {2048, 32, 3, 32, 1, 1},
      // the round-23 ring's shape: 8 spinning consumer warps, 514 KB a block (128 blocks), 64 x 1 KB a stage
      {1024, 64, 3, 32, 4, 1, 8, 514}, {1024, 64, 3, 32, 4, 1, 0, 514}, {1024, 64, 3, 32, 4, 1, 8, 0},
      {16384, 4, 3, 1, 1, 1, 8, 0},    {16384, 4, 3, 1, 1, 1, 4, 0},    {2048, 32, 3, 32, 1, 1, 8, 514},
      // round 24: matvec v7's gate+up (one 42.5 KB stage of 32 rows x K 5120 + scales, 4 stages, 20 consumer warps,
      // ~340 KB a block) and ffn_down (72.25 KB stages of 16 x 17,408, 2 stages, 17 warps, ~3 stages a block)
      {43520, 1, 4, 1, 1, 1, 20, 340}, {43520, 1, 4, 1, 1, 1, 0, 340},  {43520, 1, 4, 1, 1, 1, 20, 0},
      {73984, 1, 2, 1, 1, 1, 17, 217}, {73984, 1, 2, 1, 1, 1, 0, 217},  {73984, 1, 2, 1, 1, 1, 17, 0},
  };
  std::printf("size_B copies stages issuers group blocks/SM waiters KB/block in_flight_KB/SM  GB/s  GB/s/SM   us\n");
  for (const Cfg& c : cfgs) {
    const int blocks = c.kb ? 128 : sms * c.blocks_per_sm;
    const int64_t rows = (c.kb ? int64_t(c.kb) * 1024 / c.size : int64_t(kBytes / size_t(c.size) / size_t(blocks))) /
                         c.copies * c.copies;
    const int smem = c.stages * c.copies * c.size;
    const float ms =
        best_ms([&] { bulk_stream<<<blocks, 32 * (1 + (c.waiters > 0 ? c.waiters : 1)), smem>>>(buf, rows, c, sink); });
    CK(cudaGetLastError());
    const double bytes = double(rows) * c.size * blocks;
    std::printf("%6d %6d %6d %8d %5d %9d %7d %8d  %15d  %5.0f  %6.1f %6.1f\n", c.size, c.copies, c.stages, c.issuers,
                c.group, c.blocks_per_sm, c.waiters, c.kb, smem * c.blocks_per_sm / 1024, bytes / (ms * 1e6),
                bytes / (ms * 1e6) / sms, ms * 1e3);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
