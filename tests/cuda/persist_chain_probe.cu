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
//               into the ring, limited only by free stages; the consumers of product p start once product p - 1 is
//               finished, and `sites` extra grid barriers between products stand for the small kernels of the real
//               chain (0, 1, 2; -1: no barrier at all, the ring's own streaming ceiling). Two ways to split a product
//               (round 29): static slices (block b its 1/G of every product; p - 1 finished = every block's arrival
//               on a monotonic counter) and dynamic chunks (blocks claim SB-byte chunks with an atomic, so a faster SM
//               takes more; p - 1 finished = its done counter at its chunk count), each at several stage sizes.
// Both against the plain-load read probe over the same buffer. Rates count the weight bytes once.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/mbarrier.cuh"
#include "probe_util.cuh"

using namespace bonsai::cuda;

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
  int sites;             // persistent: extra grid barriers between two products; < 0: no barrier at all (the ring's
                         // streaming ceiling, nothing waited for)
  unsigned* sink;        // [blocks] the XORs (kept live)
  unsigned* claim;       // dynamic: [P] chunks claimed of each product (zero when the run starts)
  unsigned* done;        // dynamic: [P] chunks consumed of each product (zero when the run starts)
};

__device__ __forceinline__ int64_t lmin(int64_t x, int64_t y) { return x < y ? x : y; }

// ACQREL (round 29): a release reduction and acquire loads (the PTX memory model's one-way fences) in place of
// __threadfence (fence.sc.gpu) + atomicAdd and volatile loads + __threadfence.
template <bool ACQREL = false>
__device__ __forceinline__ void grid_arrive(unsigned* counter) {
  if constexpr (ACQREL) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
  } else {
    __threadfence();  // this block's work before its arrival
    atomicAdd(counter, 1u);
  }
}
template <bool ACQREL = false>
__device__ __forceinline__ void grid_wait(const unsigned* counter, unsigned target) {
  if constexpr (ACQREL) {
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    } while (int(v - target) < 0);
  } else {
    while (int(*reinterpret_cast<const volatile unsigned*>(counter) - target) < 0) {
    }
    __threadfence();
  }
}

// Block b's slice of product p: bytes [b B / G, (b + 1) B / G) rounded to 16.
__device__ __forceinline__ void slice(const Product& p, int64_t& lo, int64_t& n) {
  const int64_t G = gridDim.x, b = blockIdx.x, q = p.bytes / 16;
  lo = p.off + 16 * (q * b / G);
  n = 16 * (q * (b + 1) / G - q * b / G);
}

template <int SB>
__device__ __forceinline__ unsigned chunks_of(const Product& p) {
  return unsigned((p.bytes + SB - 1) / SB);
}

// The consumers' XOR of one stage of `bytes`: warp w takes 16-byte words w, w + kConsumers, ...
__device__ __forceinline__ void consume(const char* st, int64_t bytes, int cw, int lane, unsigned& acc) {
  const int words = int(bytes / 16);
  const uint4* v4 = reinterpret_cast<const uint4*>(st);
  for (int i = cw * 32 + lane; i < words; i += 32 * kConsumers) {
    const uint4 v = v4[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
}

// A block's site barriers of one product boundary b (1-based): `sites` grid-wide arrive + wait each.
__device__ __forceinline__ void site_barriers(const ChainArgs& a, int b, int cw, int lane) {
  for (int k = 1; k <= a.sites; ++k) {
    asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
    if (cw == 0 && lane == 0) {
      grid_arrive(a.counter);
      grid_wait(a.counter, a.base + unsigned((b - 1) * a.sites + k) * gridDim.x);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
  }
}

// MODE 0: one launch per product (PDL); 1: persistent, each block its static slice of every product, a grid barrier
// (all blocks' arrivals) per product; 3: 1 with release / acquire barriers (grid_arrive / grid_wait ACQREL); 2: persistent, blocks claim SB-byte chunks of each product dynamically (an
// atomic per chunk) so the faster SMs take more, and a block's consumers start product p once every chunk of p - 1 is
// consumed (a done counter per product). STAGES x SB bytes of ring.
template <int MODE, int STAGES, int SB>
__global__ __launch_bounds__(kThreads, 1) void chain_kernel(const ChainArgs a) {
  extern __shared__ __align__(128) char ring[];  // [STAGES][SB]
  __shared__ uint64_t full[STAGES], empty[STAGES];
  __shared__ int tag[STAGES];       // MODE 2: the product of the chunk in the stage (-1: the end)
  __shared__ unsigned tbytes[STAGES];  // MODE 2: its bytes
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if constexpr (MODE == 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (warp == 0) {  // ---- producer: chunks in order, as far ahead as the ring allows ----
    if (lane == 0) {
      int s = 0;
      unsigned ph = 0;
      int64_t issued = 0;
      auto next_slot = [&] {
        if (issued >= STAGES) mbar_wait(&empty[s], ph ^ 1u);
      };
      auto advance = [&] {
        ++issued;
        if (++s == STAGES) s = 0, ph ^= 1u;
      };
      if constexpr (MODE == 2) {
        for (int p = a.p0; p < a.p1; ++p) {
          const Product pr = a.prod[p];
          const unsigned nch = chunks_of<SB>(pr);
          for (;;) {
            const unsigned c = atomicAdd(&a.claim[p], 1u);
            if (c >= nch) break;
            next_slot();
            const unsigned bytes = unsigned(lmin(SB, pr.bytes - int64_t(c) * SB));
            tag[s] = p;
            tbytes[s] = bytes;
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_expect_tx(&full[s], bytes);
            bulk_load(ring + size_t(s) * SB, a.w + pr.off + int64_t(c) * SB, bytes, &full[s]);
            advance();
          }
        }
        next_slot();
        tag[s] = -1;  // the end: a plain arrival completes the stage's phase
        mbar_arrive(&full[s]);
      } else {
        for (int p = a.p0; p < a.p1; ++p) {
          int64_t lo, n;
          slice(a.prod[p], lo, n);
          for (int64_t c = 0; c < n; c += SB) {
            next_slot();
            const unsigned bytes = unsigned(lmin(SB, n - c));
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_expect_tx(&full[s], bytes);
            bulk_load(ring + size_t(s) * SB, a.w + lo + c, bytes, &full[s]);
            advance();
          }
        }
      }
    }
    if constexpr (MODE == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
    return;
  }
  // ---- consumers ----
  const int cw = warp - 1;
  int s = 0;
  unsigned ph = 0, acc = 0;
  if constexpr (MODE == 0) asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous product's output
  if constexpr (MODE == 2) {
    int cur = a.p0;  // the product whose dependency this block has met
    for (;;) {
      mbar_wait(&full[s], ph);
      const int p = tag[s];
      const int upto = p < 0 ? a.p1 - 1 : p;  // at the end: every boundary left, so no block waits for this one
      while (cur < upto) {
        ++cur;
        if (a.sites > 0) site_barriers(a, cur - a.p0, cw, lane);
        if (p >= 0 && cur == p && a.sites >= 0) {  // product p reads p - 1's output: every chunk of it consumed
          if (cw == 0 && lane == 0) grid_wait(&a.done[p - 1], chunks_of<SB>(a.prod[p - 1]));
          asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
        }
      }
      if (p < 0) break;
      consume(ring + size_t(s) * SB, tbytes[s], cw, lane, acc);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
      if (++s == STAGES) s = 0, ph ^= 1u;
      asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");  // every warp done with the chunk
      if (cw == 0 && lane == 0) {
        __threadfence();
        atomicAdd(&a.done[p], 1u);
      }
    }
  } else {
    constexpr bool kAR = MODE == 3;
    for (int p = a.p0; p < a.p1; ++p) {
      if (MODE != 0 && p > a.p0 && a.sites >= 0) {
        // p - p0 dependency points passed: (sites + 1) barriers per product boundary
        for (int k = 0; k <= a.sites; ++k) {
          const unsigned stage_no = unsigned((p - a.p0 - 1) * (a.sites + 1) + k + 1);
          if (k > 0) {  // a site: one arrival per block, then wait for all
            asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
            if (cw == 0 && lane == 0) grid_arrive<kAR>(a.counter);
          }
          if (cw == 0 && lane == 0) grid_wait<kAR>(a.counter, a.base + stage_no * gridDim.x);
          asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
        }
      }
      int64_t lo, n;
      slice(a.prod[p], lo, n);
      for (int64_t c = 0; c < n; c += SB) {
        mbar_wait(&full[s], ph);
        consume(ring + size_t(s) * SB, lmin(SB, n - c), cw, lane, acc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
        if (++s == STAGES) s = 0, ph ^= 1u;
      }
      if (MODE != 0 && a.sites >= 0) {  // this block is done with product p: its output is "written"
        asm volatile("bar.sync 1, %0;" ::"r"(32 * kConsumers) : "memory");
        if (cw == 0 && lane == 0) grid_arrive<kAR>(a.counter);
      }
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
  constexpr int kRuns = 16;  // MODE 2 runs per configuration (2 warm-ups + 10 timed): their own zeroed counters
  unsigned* counts;          // [kRuns][2][P] claim, done
  CK(cudaMalloc(&counts, sizeof(unsigned) * 2 * size_t(kRuns) * size_t(P)));
  ProbeTimer tm;
  CK(tm.init());
  const cudaStream_t st = tm.st;
  std::printf("device: %d SMs; the chain: %d products, %.3f GB\n", sms, P, double(total) / 1e9);

  // The read probe over the same bytes.
  const double probe_ms = tm.read_ms(w, size_t(total), sms, fsink);
  const double probe = double(total) / (probe_ms * 1e-3) / 1e9;
  std::printf("read probe: %.0f GB/s (%.3f ms for the chain's bytes)\n", probe, probe_ms);
  auto report = [&](const char* what, double ms) {
    std::printf("%s: %.3f ms a chain = %.0f GB/s = %.1f %% of the probe; %.2f us a product above its bytes\n", what, ms,
                double(total) / (ms * 1e-3) / 1e9, 100.0 * probe_ms / ms, 1e3 * (ms - probe_ms) / P);
  };

  // Launches: one per product, programmatic serialization, in one graph (4 x 48 KB stages, v7's ring).
  {
    constexpr int S = 4, SB = 48 * 1024;
    CK(cudaFuncSetAttribute(chain_kernel<0, S, SB>, cudaFuncAttributeMaxDynamicSharedMemorySize, S * SB));
    cudaGraphExec_t exec;
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < P; ++p) {
      ChainArgs a{w, dprod, p, p + 1, counter, 0, 0, sink, nullptr, nullptr};
      CK(launch_pdl(st, chain_kernel<0, S, SB>, dim3(unsigned(sms)), dim3(kThreads), size_t(S * SB), a));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    char what[96];
    std::snprintf(what, sizeof what, "launches (%d kernels, PDL, one graph; %d x %d KB)", P, S, SB / 1024);
    report(what, tm.ms([&] { cudaGraphLaunch(exec, st); }, 10));
  }

  // Persistent: one kernel of one block per SM; `sites` extra grid barriers per boundary (< 0: none at all).
  unsigned base = 0;
  auto persistent = [&](auto kernel, int mode, int stages, int sb, int sites) -> int {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, stages * sb));
    CK(cudaMemsetAsync(counts, 0, sizeof(unsigned) * 2 * size_t(kRuns) * size_t(P), st));
    int run_no = 0;
    auto run = [&] {
      unsigned* c = counts + size_t(run_no++ % kRuns) * 2 * size_t(P);
      ChainArgs a{w, dprod, 0, P, counter, base, sites, sink, c, c + P};
      kernel<<<sms, kThreads, stages * sb, st>>>(a);
      const unsigned barriers = sites < 0 ? 0u : unsigned(P - 1) * unsigned(sites) + (mode != 2 ? unsigned(P) : 0u);
      base += barriers * unsigned(sms);
    };
    const double ms = tm.ms(run, 10);
    char what[128];
    std::snprintf(what, sizeof what, "persistent %s, %d x %d KB, %s",
                  mode == 1 ? "static slices" : (mode == 3 ? "static slices, acq/rel barriers" : "dynamic chunks"),
                  stages, sb / 1024,
                  sites < 0 ? "no barrier (the ring's streaming ceiling)"
                            : (sites == 0 ? "the dependency only" : (sites == 1 ? "+ 1 site barrier a boundary" : "+ 2 site barriers a boundary")));
    report(what, ms);
    return 0;
  };
  if (persistent(chain_kernel<1, 4, 48 * 1024>, 1, 4, 48 * 1024, -1)) return 1;
  if (persistent(chain_kernel<1, 4, 48 * 1024>, 1, 4, 48 * 1024, 0)) return 1;
  if (persistent(chain_kernel<1, 24, 8 * 1024>, 1, 24, 8 * 1024, 0)) return 1;
  for (int sites = 0; sites <= 2; ++sites)
    if (persistent(chain_kernel<3, 4, 48 * 1024>, 3, 4, 48 * 1024, sites)) return 1;
  // Round 29, call 2: the dynamic chunks ran at 12-36 % of the probe (an atomic claim per chunk on the producer's
  // path: 4 / 8 / 16 KB chunks 44 / 22 / 11 us a product above its bytes); one row kept as the record.
  if (persistent(chain_kernel<2, 12, 16 * 1024>, 2, 12, 16 * 1024, 0)) return 1;
  CK(cudaDeviceSynchronize());
  std::printf("(570 tok/s at batch 1 is %.3f ms a token for 7.227 GB)\n", 1e3 / 570.0);
  return 0;
}
