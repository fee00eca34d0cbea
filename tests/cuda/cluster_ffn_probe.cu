// What a batch-1 FFN costs when gate+up and ffn_down meet at a CLUSTER barrier instead of a grid-wide dependency (round
// 29; not part of the build: compiled and run on the device by `nvcc -O3 -arch=sm_90a -std=c++17 -Isrc
// tests/cuda/cluster_ffn_probe.cu -o /tmp/cfp && /tmp/cfp`, device_round21.sh CLUSTER_PROBE=1). Not yet run.
//
// Why: persist_chain_probe.cu (round 29, section 1 of docs/cuda-kernels.md) measured a grid-wide dependency at >= 1.84
// us (a PDL launch boundary) to 2.7 us (a grid barrier in a persistent kernel), so the 257 dependent products of a
// decode token floor it near 2.0 ms whatever the kernels do. An FFN need not be two grid-wide steps: split ffn_down's K
// (17,408) in the Hadamard's 1,024-column blocks, and the 17 chunks are independent. A cluster computes chunk c's
// 2 x 1,024 gate / up rows, the SwiGLU + FWHT + quantiser of that 1,024-block (its own rows: distributed shared
// memory), then its split-K share of ffn_down over those columns (down repacked by column chunk at upload), and the
// partial sums meet in the next kernel (the AddNorm site, grid-wide anyway). The grid then waits once per FFN, not
// twice, and the wait between gate+up and down is a cluster's.
//
// This streams the bytes of that structure with nothing computed but an XOR of every word (as persist_chain_probe), the
// 64 FFNs of a token (gate+up 47.35 MB, down 23.67 MB each) as:
//   split:    two launches per FFN over all SMs (one per product: today's structure), PDL, one graph;
//   cluster:  one launch per FFN of 17 clusters x CS blocks; block r of cluster c streams its 1 / CS of chunk c's
//             gate+up bytes, then (after a cluster barrier: every block of the cluster done with its gate+up share)
//             its 1 / CS of chunk c's down bytes; its producer warp streams on across the barrier (weights depend on
//             nothing); PDL between the FFNs, one graph;
//   nobar:    the same without the cluster barrier (its streaming ceiling);
//   group:    one launch per FFN over ALL SMs (one block each, no cluster), block b in group c = b * 17 / grid of 17;
//             the group's blocks meet at a software barrier (a global arrival counter and a poll) instead of the
//             cluster barrier: no GPC packing limit (a cluster of 7-8 one-block SMs fits 2 to a GPC), one L2 round
//             trip more. All blocks are resident (grid = SMs, one block an SM), so the poll ends.
// CS = 6, 7, 8 (17 x 7 = 119 blocks; a GPC holds 16-18 SMs, so 2 blocks an SM are allowed by the ring's size).
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "probe_ring.cuh"
#include "probe_util.cuh"

using namespace bonsai::cuda;

constexpr int kConsumers = 8;  // consumer warps
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kStages = 4;
constexpr int kStageBytes = 24 * 1024;  // 96 KB of ring: two blocks fit an SM
constexpr int kChunks = 17;             // 17,408 / 1,024

struct FfnArgs {
  const char* w;       // the token's weights
  int64_t up_off;      // gate+up bytes of this FFN (split: the launch's product)
  int64_t up_bytes;
  int64_t down_off;    // down bytes (cluster modes); split: unused
  int64_t down_bytes;
  unsigned* sink;      // [blocks] the XORs (kept live)
  unsigned* count;     // group mode: [17] arrival counters, monotone over launches (zeroed once)
  int32_t mode;        // 0 split, 1 cluster, 2 nobar, 3 group
  int32_t cs;          // cluster size (modes 1, 2)
};

__global__ __launch_bounds__(kThreads) void ffn_kernel(const FfnArgs a) {
  auto rg = ProbeRing<kStages, kStageBytes, kConsumers>::start();  // the weight ring, its barriers initialised
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // This block's two runs: split mode one run (its 1 / grid of the launch's product); cluster modes its 1 / cs of its
  // cluster's chunk of gate+up, then of down.
  int64_t lo[2], n[2];
  int group = 0, gsize = 1;  // group mode: this block's group and its size
  if (a.mode == 0) {
    part_of(a.up_off, a.up_bytes, int(blockIdx.x), int(gridDim.x), lo[0], n[0]);
    lo[1] = n[1] = 0;
  } else {
    int c = int(blockIdx.x) / a.cs, r = int(blockIdx.x) % a.cs, parts = a.cs;
    if (a.mode == 3) {
      probe_group(int(blockIdx.x), int(gridDim.x), kChunks, c, r, parts);
      group = c, gsize = parts;
    }
    int64_t clo, cn;
    part_of(a.up_off, a.up_bytes, c, kChunks, clo, cn);
    part_of(clo, cn, r, parts, lo[0], n[0]);
    part_of(a.down_off, a.down_bytes, c, kChunks, clo, cn);
    part_of(clo, cn, r, parts, lo[1], n[1]);
  }
  if (warp == 0) {  // ---- producer: both runs' stages in order, as far ahead as the ring allows ----
    for (int run = 0; run < 2; ++run) {
      if (lane == 0) rg.produce(a.w + lo[run], n[run]);
      __syncwarp();
      // The cluster barrier counts every non-exited thread: the producer warp arrives once its gate+up copies are
      // issued (never waits) and streams on. Arriving only after run 1 would deadlock: run 1's stages free up only
      // once the consumers are past the barrier.
      if (run == 0 && a.mode == 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    return;
  }
  // ---- consumers: warp w XORs 16-byte words w, w + kConsumers, ... of each stage ----
  const int cw = warp - 1;
  unsigned acc = 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous FFN's output
  for (int run = 0; run < 2; ++run) {
    if (run == 1 && a.mode == 1) {  // gate+up of the whole chunk consumed (its SwiGLU + quantiser would be here)
      asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
      asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    // the group's software barrier: one arrival a block, a poll for the group's last
    if (run == 1 && a.mode == 3) group_barrier<kConsumers>(a.count + group, gsize, cw == 0 && lane == 0);
    acc = rg.consume(n[run], cw, lane, acc);
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (lane == 0 && acc == 0x9e3779b9u) a.sink[blockIdx.x] = acc;  // never: keeps the reads
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kFfns = 64;
  const int64_t unit = 16 * 8 * kChunks * 132;  // every split and part a multiple of 16 bytes
  const int64_t up = (int64_t(47.35e6) / unit) * unit, down = (int64_t(23.67e6) / unit) * unit;
  const int64_t total = kFfns * (up + down);
  char* w;
  CK(cudaMalloc(&w, size_t(total)));
  CK(cudaMemset(w, 1, size_t(total)));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4 * 1024));
  unsigned* count;
  CK(cudaMalloc(&count, 4 * kChunks));
  CK(cudaMemset(count, 0, 4 * kChunks));
  float* fsink;
  CK(cudaMalloc(&fsink, 4));
  CK(cudaFuncSetAttribute(ffn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * kStageBytes));
  ProbeTimer tm;
  CK(tm.init());
  const cudaStream_t st = tm.st;
  std::printf("device: %d SMs; %d FFNs, %.3f GB (gate+up %.2f MB, down %.2f MB each)\n", sms, kFfns, total / 1e9,
              up / 1e6, down / 1e6);
  const double probe_ms = tm.read_ms(w, size_t(total), sms, fsink);
  std::printf("read probe: %.0f GB/s (%.3f ms for these bytes)\n", total / (probe_ms * 1e-3) / 1e9, probe_ms);
  // One graph of the launches of a configuration; returns its ms per token (the 64 FFNs), -1 on an error (printed).
  auto chain = [&](int mode, int cs) -> double {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1;
    for (int f = 0; f < kFfns; ++f) {
      const int64_t base = f * (up + down);
      for (int launch = 0; launch < (mode == 0 ? 2 : 1); ++launch) {
        FfnArgs a{w, base, up, base + up, down, sink, count, mode, cs};
        if (mode == 0 && launch == 1) a.up_off = base + up, a.up_bytes = down;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(unsigned(mode == 0 || mode == 3 ? sms : kChunks * cs));
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = size_t(kStages * kStageBytes);
        cfg.stream = st;
        cudaLaunchAttribute at[2];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        at[1].id = cudaLaunchAttributeClusterDimension;
        at[1].val.clusterDim.x = unsigned(mode == 0 || mode == 3 ? 1 : cs);
        at[1].val.clusterDim.y = at[1].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 2;
        const cudaError_t e = cudaLaunchKernelEx(&cfg, ffn_kernel, a);
        if (e != cudaSuccess) {
          std::printf("launch (mode %d, cs %d): %s\n", mode, cs, cudaGetErrorString(e));
          cudaStreamEndCapture(st, &g);
          return -1;
        }
      }
    }
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) {
      std::printf("graph (mode %d, cs %d): %s\n", mode, cs, cudaGetErrorString(cudaGetLastError()));
      return -1;
    }
    const double ms = tm.ms([&] { cudaGraphLaunch(exec, st); }, 10);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    return ms;
  };
  auto report = [&](const char* what, int cs, double ms) {
    if (ms < 0) return;
    std::printf("%-44s cs %d: %.3f ms = %.1f %% of the probe; %.2f us an FFN (%.2f above its bytes)\n", what, cs, ms,
                100.0 * probe_ms / ms, 1e3 * ms / kFfns, 1e3 * (ms - probe_ms) / kFfns);
  };
  report("split (two launches an FFN, today's)", 1, chain(0, 1));
  report("group (one launch, all SMs, software barrier)", 1, chain(3, 1));
  for (int cs : {6, 7, 8}) {
    int clusters = 0;  // how many clusters of this shape fit at once
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(kChunks * cs));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = size_t(kStages * kStageBytes);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = unsigned(cs);
    at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, ffn_kernel, &cfg) == cudaSuccess)
      std::printf("cs %d: %d clusters resident at once (17 needed)\n", cs, clusters);
    report("cluster (one launch an FFN, cluster barrier)", cs, chain(1, cs));
    report("nobar (the same, no barrier)", cs, chain(2, cs));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
