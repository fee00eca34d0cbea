// The floor of a decode token's chain of dependent weight streams, as separate launches and as one persistent kernel
// (round 28; not part of the build: compiled and run on the device by `nvcc -O3 -arch=sm_90a -std=c++17 -Isrc
// tests/cuda/persist_chain_probe.cu -o /tmp/pcp && /tmp/pcp`, device_round21.sh PERSIST_PROBE=1).
//
// Why: at batch 1 a token is 257 ternary products in a chain (each reads the previous one's output), 7.2 GB of weights;
// the decode runs at ~37 % of the read probe, and back to back each v7 launch costs ~5 us above its bytes (gdn_out 6.7
// us for 8.4 MB), before any of the small kernels between them. A persistent kernel would stream every product's
// weights through one shared-memory ring per SM without a gap (weights do not depend on activations) and meet the
// dependency at a grid barrier instead of a launch boundary. This measures both floors with the real products' sizes
// and nothing computed but an XOR of every word (so neither is held by v7's arithmetic):
//   launches:   one kernel per product, as v7: the block's copies issued before griddepcontrol.wait, the consumers
//               after it (the dependency), launched with programmatic stream serialization in a CUDA graph;
//   persistent: one kernel of one block per SM for the whole chain: the producer warp streams product after product
//               into the ring, limited only by free stages; the consumers of product p start once every block has
//               finished product p - 1 (a monotonic arrival counter in global memory; one release add and an acquire
//               spin per block and product), and `sites` extra grid barriers between products stand for the small
//               kernels of the real chain (0, 1, 2).
// Both against the plain-load read probe over the same buffer. Rates count the weight bytes once.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/mbarrier.cuh"
#include "probe_util.cuh"

using namespace bonsai::cuda;

constexpr int kStages = 4;                  // ring stages per block
constexpr int kStageBytes = 48 * 1024;      // 192 KB of ring: v7's ~200 KB
constexpr int kConsumers = 8;               // consumer warps
constexpr int kThreads = 32 * (kConsumers + 1);

struct Product {
  int64_t off, bytes;  // into the weight buffer; bytes a multiple of 16 x blocks
};
struct ChainArgs {
  const char* w;
  const Product* prod;
  int p0, p1;            // products [p0, p1) of this launch
  unsigned* counter;     // persistent: block arrivals, monotonic across runs
  unsigned base;         // the counter's value when this run started
  int sites;             // persistent: extra grid barriers between two products
  unsigned* sink;        // [blocks] the XORs (kept live)
};

__device__ __forceinline__ int64_t lmin(int64_t x, int64_t y) { return x < y ? x : y; }

__device__ __forceinline__ void grid_arrive(unsigned* counter) {
  __threadfence();  // this block's work before its arrival
  atomicAdd(counter, 1u);
}
__device__ __forceinline__ void grid_wait(const unsigned* counter, unsigned target) {
  while (int(*reinterpret_cast<const volatile unsigned*>(counter) - target) < 0) {
  }
  __threadfence();
}

// Block b's slice of product p: bytes [b B / G, (b + 1) B / G) rounded to 16.
__device__ __forceinline__ void slice(const Product& p, int64_t& lo, int64_t& n) {
  const int64_t G = gridDim.x, b = blockIdx.x, q = p.bytes / 16;
  lo = p.off + 16 * (q * b / G);
  n = 16 * (q * (b + 1) / G - q * b / G);
}

template <bool PERSIST>
__global__ __launch_bounds__(kThreads, 1) void chain_kernel(const ChainArgs a) {
  extern __shared__ __align__(128) char ring[];  // [kStages][kStageBytes]
  __shared__ uint64_t full[kStages], empty[kStages];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if constexpr (!PERSIST) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (warp == 0) {  // ---- producer: every product's chunks in order, as far ahead as the ring allows ----
    if (lane == 0) {
      int s = 0;
      unsigned ph = 0;
      int64_t issued = 0;
      for (int p = a.p0; p < a.p1; ++p) {
        int64_t lo, n;
        slice(a.prod[p], lo, n);
        for (int64_t c = 0; c < n; c += kStageBytes, ++issued) {
          if (issued >= kStages) mbar_wait(&empty[s], ph ^ 1u);
          const unsigned bytes = unsigned(lmin(kStageBytes, n - c));
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          mbar_expect_tx(&full[s], bytes);
          bulk_load(ring + size_t(s) * kStageBytes, a.w + lo + c, bytes, &full[s]);
          if (++s == kStages) s = 0, ph ^= 1u;
        }
      }
    }
    if constexpr (!PERSIST) asm volatile("griddepcontrol.wait;" ::: "memory");
    return;
  }
  // ---- consumers: warp w XORs 16-byte words w, w + kConsumers, ... of each chunk ----
  const int cw = warp - 1;
  int s = 0;
  unsigned ph = 0, acc = 0;
  if constexpr (!PERSIST) asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous product's output
  for (int p = a.p0; p < a.p1; ++p) {
    if constexpr (PERSIST) {
      if (p > a.p0) {
        // p - p0 dependency points passed: (sites + 1) barriers per product boundary
        for (int k = 0; k <= a.sites; ++k) {
          const unsigned stage_no = unsigned((p - a.p0 - 1) * (a.sites + 1) + k + 1);
          if (k > 0) {  // a site: one arrival per block, then wait for all
            asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
            if (cw == 0 && lane == 0) grid_arrive(a.counter);
          }
          if (cw == 0 && lane == 0) grid_wait(a.counter, a.base + stage_no * gridDim.x);
          asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
        }
      }
    }
    int64_t lo, n;
    slice(a.prod[p], lo, n);
    for (int64_t c = 0; c < n; c += kStageBytes) {
      mbar_wait(&full[s], ph);
      const int words = int(lmin(kStageBytes, n - c) / 16);
      const uint4* st = reinterpret_cast<const uint4*>(ring + size_t(s) * kStageBytes);
      for (int i = cw * 32 + lane; i < words; i += 32 * kConsumers) {
        const uint4 v = st[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
      if (++s == kStages) s = 0, ph ^= 1u;
    }
    if constexpr (PERSIST) {  // this block is done with product p: its output is "written"
      asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
      if (cw == 0 && lane == 0) grid_arrive(a.counter);
    }
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (lane == 0 && acc == 0x9e3779b9u) a.sink[blockIdx.x] = acc;  // never: keeps the reads
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // The 27b decode's products (MB, from the kernel table and bench's bytes per token): 48 GDN layers (qkv+z, gdn_out,
  // gate+up, ffn_down), 16 attention layers (q+k+v, attn_o, gate+up, ffn_down), the head.
  std::vector<double> mb;
  for (int l = 0; l < 64; ++l) {
    const bool attn = l % 4 == 3;
    mb.push_back(attn ? 18.6 : 22.28);
    mb.push_back(8.36);
    mb.push_back(47.35);
    mb.push_back(23.67);
  }
  mb.push_back(650.0);
  std::vector<Product> prod;
  int64_t total = 0;
  const int64_t unit = 16 * int64_t(sms);
  for (double m : mb) {
    const int64_t b = (int64_t(m * 1e6) / unit) * unit;
    prod.push_back({total, b});
    total += b;
  }
  const int P = int(prod.size());
  char* w;
  CK(cudaMalloc(&w, size_t(total)));
  CK(cudaMemset(w, 1, size_t(total)));
  Product* dprod;
  CK(cudaMalloc(&dprod, sizeof(Product) * prod.size()));
  CK(cudaMemcpy(dprod, prod.data(), sizeof(Product) * prod.size(), cudaMemcpyHostToDevice));
  unsigned *counter, *sink;
  CK(cudaMalloc(&counter, 4));
  CK(cudaMemset(counter, 0, 4));
  CK(cudaMalloc(&sink, 4 * size_t(sms)));
  float* fsink;
  CK(cudaMalloc(&fsink, 4));
  const int smem = kStages * kStageBytes;
  CK(cudaFuncSetAttribute(chain_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(chain_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("device: %d SMs; the chain: %d products, %.3f GB\n", sms, P, double(total) / 1e9);

  auto time_ms = [&](auto&& run, int reps) -> double {
    run();
    run();
    CK(cudaStreamSynchronize(st));
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r) run();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) / reps;
  };
  // The read probe over the same bytes.
  const double probe_ms = time_ms([&] { read_only<<<4 * sms, 512, 0, st>>>(reinterpret_cast<const float4*>(w), size_t(total) / 16, fsink); }, 5);
  const double probe = double(total) / (probe_ms * 1e-3) / 1e9;
  std::printf("read probe: %.0f GB/s (%.3f ms for the chain's bytes)\n", probe, probe_ms);

  // Launches: one per product, programmatic serialization, in one graph.
  cudaGraphExec_t exec;
  {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < P; ++p) {
      ChainArgs a{w, dprod, p, p + 1, counter, 0, 0, sink};
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(sms));
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = size_t(smem);
      cfg.stream = st;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, chain_kernel<false>, a));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
  }
  const double launch_ms = time_ms([&] { cudaGraphLaunch(exec, st); }, 10);
  std::printf("launches (%d kernels, PDL, one graph): %.3f ms a chain = %.0f GB/s = %.1f %% of the probe; %.2f us a product above its bytes\n",
              P, launch_ms, double(total) / (launch_ms * 1e-3) / 1e9, 100.0 * probe_ms / launch_ms,
              1e3 * (launch_ms - probe_ms) / P);

  // Persistent: one kernel, sites = 0, 1, 2 extra grid barriers per boundary.
  unsigned base = 0;
  for (int sites = 0; sites <= 2; ++sites) {
    auto run = [&] {
      ChainArgs a{w, dprod, 0, P, counter, base, sites, sink};
      chain_kernel<true><<<sms, kThreads, smem, st>>>(a);
      base += unsigned(P) * unsigned(sms) + unsigned(P - 1) * unsigned(sites) * unsigned(sms);
    };
    const double ms = time_ms(run, 10);
    std::printf("persistent, %d site barrier(s) a boundary: %.3f ms a chain = %.0f GB/s = %.1f %% of the probe; %.2f us a product above its bytes\n",
                sites, ms, double(total) / (ms * 1e-3) / 1e9, 100.0 * probe_ms / ms, 1e3 * (ms - probe_ms) / P);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::printf("(570 tok/s at batch 1 is %.3f ms a token for 7.227 GB)\n", 1e3 / 570.0);
  return 0;
}
