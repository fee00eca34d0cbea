// What a batch-1 GDN mixer (qkv+z -> conv + delta step + gated-norm site -> gdn_out) could cost as ONE launch of
// head groups instead of today's chain of four (round 36; not part of the build: compiled and run on the device by
// `nvcc -O3 -arch=sm_90a -std=c++17 -Isrc tests/cuda/gdn_mixer_probe.cu -o /tmp/gmp && /tmp/gmp`, device_round29.sh
// GDN_PROBE=1). Not yet run.
//
// Why: round 27's v7 timeline put 11.7 us between qkv+z's end and gdn_out's start in each of the 48 GDN layers (the
// conv + a / b launch, then the delta step with its site), and ~5 us before qkv+z; the fused FFN (rounds 30-33) showed
// that one launch of groups meeting at software barriers beats three launches once its copies are right (+5.6 %
// tg128). The mixer splits the same way: gdn_out's input site is blockwise over 1,024 columns = 8 V heads, so 6
// groups, each needing only its heads' q / k / v / z rows (round 34's sketch in docs/cuda-kernels.md). Before
// building it (a larger kernel than the FFN: the step's state, a second barrier for the site's exchange), this
// streams its bytes in both structures with nothing computed but an XOR of every weight word and a read + write of the
// recurrent state (as cluster_ffn_probe.cu did before the FFN):
//   chain:  per layer four launches, PDL, one graph: the qkv+z + a / b bytes over all SMs; a conv-sized kernel (40
//           blocks: 10,240 channels' input and 3-tap state read and written); a delta-step-sized kernel (192 blocks of
//           256 threads, each a 16 KB slice of the fp32 state read after the wait, prefetched into L2 before it, and
//           written back); gdn_out's bytes over all SMs. Today's structure less the AddNorm and FFN around it.
//   group:  one launch per layer over all SMs, block b in group b x 6 / grid: its share of its group's qkv+z rows
//           (1 / 6 of the bytes), the group's barrier (a monotone arrival counter and a poll), its share of the
//           group's state slice (read and written by the consumers), a second group barrier (the site's exchange:
//           every block needs the group's whole 1,024-element output for the Hadamard), then its share of gdn_out's
//           column chunk (1 / 6 of its bytes). The producer warp streams gdn_out's stages behind qkv+z's (weights
//           depend on nothing), so they land while the group meets;
//   1bar:   group with the second barrier left out (what the site's exchange costs);
//   nobar:  group with no barrier at all (its streaming ceiling).
// All against the plain-load read probe over the same weight buffer; the rates count the weights and the state's
// read and write once each.
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

#include "probe_ring.cuh"
#include "probe_util.cuh"

using namespace bonsai::cuda;

constexpr int kConsumers = 8;  // consumer warps
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kStages = 4;
constexpr int kStageBytes = 48 * 1024;  // 192 KB of ring: one block an SM, as v7 and the fused FFN
constexpr int kGroups = 6;              // 6,144 / 1,024: gdn_out's input chunks (8 V heads each)
constexpr int kLayers = 48;             // the 27b's GDN layers
constexpr int64_t kStateBytes = 48LL * 128 * 128 * 4;  // 48 V heads x Dk 128 x Dv 128 fp32: 3.15 MB a layer
constexpr int kConvChannels = 10240;                   // q | k | v channels of the short conv (kernel 4: 3 taps of state)

struct MixerArgs {
  const char* w;       // the token's weights
  int64_t a_off;       // qkv+z (+ the a / b pair) bytes of this layer (chain: the launch's product)
  int64_t a_bytes;
  int64_t b_off;       // gdn_out bytes (group modes); chain: unused
  int64_t b_bytes;
  float* state;        // group modes: this layer's fp32 state [kStateBytes / 4]
  unsigned* sink;      // [blocks] the XORs (kept live)
  unsigned* count;     // group modes: [2 x kGroups] arrival counters, monotone over launches (zeroed once)
  int32_t mode;        // 0 chain (a product launch), 1 group, 2 1bar, 3 nobar
};

__global__ __launch_bounds__(kThreads) void mixer_kernel(const MixerArgs a) {
  auto rg = ProbeRing<kStages, kStageBytes, kConsumers>::start();  // the weight ring, its barriers initialised
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // This block's runs: chain mode one (its 1 / grid of the launch's product); group modes its share of its group's
  // qkv+z bytes, then of its group's gdn_out bytes, and its share of the group's state slice.
  int64_t lo[2], n[2], s_lo = 0, s_n = 0;
  int group = 0, gsize = 1, r = 0;
  if (a.mode == 0) {
    part_of(a.a_off, a.a_bytes, int(blockIdx.x), int(gridDim.x), lo[0], n[0]);
    lo[1] = n[1] = 0;
  } else {
    probe_group(int(blockIdx.x), int(gridDim.x), kGroups, group, r, gsize);
    int64_t clo, cn;
    part_of(a.a_off, a.a_bytes, group, kGroups, clo, cn);
    part_of(clo, cn, r, gsize, lo[0], n[0]);
    part_of(a.b_off, a.b_bytes, group, kGroups, clo, cn);
    part_of(clo, cn, r, gsize, lo[1], n[1]);
    part_of(0, kStateBytes, group, kGroups, clo, cn);
    part_of(clo, cn, r, gsize, s_lo, s_n);
  }
  if (warp == 0) {  // ---- producer: both runs' stages in order, as far ahead as the ring allows ----
    if (lane == 0)
      for (int run = 0; run < 2; ++run) rg.produce(a.w + lo[run], n[run]);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    return;
  }
  // ---- consumers: warp w XORs 16-byte words w, w + kConsumers, ... of each stage ----
  const int cw = warp - 1, ct = threadIdx.x - 32;
  unsigned acc = 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous layer's output
  for (int run = 0; run < 2; ++run) {
    if (run == 1 && a.mode != 0) {  // group modes: the group's qkv+z rows are done; the step over its state slice
      if (a.mode != 3) group_barrier<kConsumers>(a.count + group, gsize, ct == 0);
      float4* st = reinterpret_cast<float4*>(a.state) + s_lo / 16;
      for (int64_t i = ct; i < s_n / 16; i += kConsumers * 32) {
        float4 v = __ldcg(st + i);
        v.x = v.x * 0.999f + 1e-3f, v.y = v.y * 0.999f + 1e-3f, v.z = v.z * 0.999f + 1e-3f, v.w = v.w * 0.999f;
        __stcg(st + i, v);
      }
      if (a.mode == 1) group_barrier<kConsumers>(a.count + kGroups + group, gsize, ct == 0);  // the site's exchange
    }
    acc = rg.consume(n[run], cw, lane, acc);
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (lane == 0 && acc == 0x9e3779b9u) a.sink[blockIdx.x] = acc;  // never: keeps the reads
}

// The chain's conv stand-in: 10,240 channels, each its input and 3 taps of state read and the state written back.
__global__ __launch_bounds__(256) void conv_kernel(const float* x, float* conv_state, float* out) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= kConvChannels) return;
  const float s0 = conv_state[c], s1 = conv_state[kConvChannels + c], s2 = conv_state[2 * kConvChannels + c];
  const float v = x[c];
  out[c] = 0.25f * (s0 + s1 + s2 + v);
  conv_state[c] = s1, conv_state[kConvChannels + c] = s2, conv_state[2 * kConvChannels + c] = v;
}

// The chain's delta-step stand-in: 192 blocks of 256 threads, block b a 16 KB slice of the state: prefetched into L2
// before the wait (as delta_step_kernel), read after it, one block barrier, written back.
__global__ __launch_bounds__(256) void delta_kernel(float* state, float* out) {
  __shared__ float part[8];
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  float4* st = reinterpret_cast<float4*>(state) + int64_t(blockIdx.x) * 1024;  // 1,024 float4 = 16 KB a block
  if (threadIdx.x < 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(st + 8 * threadIdx.x));
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float4 v[4];
  float p = 0.f;
  for (int i = 0; i < 4; ++i) {
    v[i] = st[threadIdx.x + 256 * i];
    p += v[i].x + v[i].y + v[i].z + v[i].w;
  }
  p += __shfl_xor_sync(0xffffffffu, p, 16);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = p;
  __syncthreads();
  const float d = 1e-6f * (part[0] + part[7]);
  for (int i = 0; i < 4; ++i) {
    v[i].x = v[i].x * 0.999f + d;
    st[threadIdx.x + 256 * i] = v[i];
  }
  if (threadIdx.x < 32) out[blockIdx.x * 32 + threadIdx.x] = d;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t unit = 16 * 8 * kGroups * 132;  // every split and part a multiple of 16 bytes
  const int64_t abytes = (int64_t(22.28e6 + 0.98e6) / unit) * unit, bbytes = (int64_t(8.36e6) / unit) * unit;
  const int64_t total = kLayers * (abytes + bbytes);
  char* w;
  CK(cudaMalloc(&w, size_t(total)));
  CK(cudaMemset(w, 1, size_t(total)));
  float *state, *conv_state, *x, *out;
  CK(cudaMalloc(&state, size_t(kLayers * kStateBytes)));
  CK(cudaMemset(state, 0, size_t(kLayers * kStateBytes)));
  CK(cudaMalloc(&conv_state, size_t(kLayers) * 3 * kConvChannels * 4));
  CK(cudaMemset(conv_state, 0, size_t(kLayers) * 3 * kConvChannels * 4));
  CK(cudaMalloc(&x, kConvChannels * 4));
  CK(cudaMemset(x, 0, kConvChannels * 4));
  CK(cudaMalloc(&out, 192 * 32 * 4 + kConvChannels * 4));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4 * 1024));
  unsigned* count;
  CK(cudaMalloc(&count, 4 * 2 * kGroups));
  CK(cudaMemset(count, 0, 4 * 2 * kGroups));
  float* fsink;
  CK(cudaMalloc(&fsink, 4));
  CK(cudaFuncSetAttribute(mixer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * kStageBytes));
  ProbeTimer tm;
  CK(tm.init());
  const cudaStream_t st = tm.st;
  const double moved = double(total) + 2.0 * kLayers * kStateBytes;  // weights once, the state read and written
  std::printf("device: %d SMs; %d GDN mixers, %.3f GB of weights (qkv+z + a / b %.2f MB, gdn_out %.2f MB each) + "
              "state %.2f MB a layer read and written\n",
              sms, kLayers, total / 1e9, abytes / 1e6, bbytes / 1e6, kStateBytes / 1e6);
  const double probe_ms = tm.read_ms(w, size_t(total), sms, fsink);
  const double probe_gbs = total / (probe_ms * 1e-3) / 1e9;
  const double floor_ms = moved / (probe_gbs * 1e9) * 1e3;
  std::printf("read probe: %.0f GB/s; these bytes (weights + state twice) take %.3f ms at it\n", probe_gbs, floor_ms);
  auto launch = [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
    return launch_pdl(st, kernel, grid, block, smem, args...);
  };
  // One graph of a mode's launches for the 48 layers; returns its ms per token, -1 on an error (printed).
  auto chain = [&](int mode) -> double {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1;
    cudaError_t e = cudaSuccess;
    for (int l = 0; l < kLayers && e == cudaSuccess; ++l) {
      const int64_t base = l * (abytes + bbytes);
      float* lstate = state + int64_t(l) * (kStateBytes / 4);
      MixerArgs a{w, base, abytes, base + abytes, bbytes, lstate, sink, count, mode};
      const size_t smem = size_t(kStages * kStageBytes);
      if (mode == 0) {
        e = launch(mixer_kernel, dim3(unsigned(sms)), dim3(kThreads), smem, a);
        if (e == cudaSuccess)
          e = launch(conv_kernel, dim3(kConvChannels / 256), dim3(256), size_t(0), x,
                     conv_state + int64_t(l) * 3 * kConvChannels, out);
        if (e == cudaSuccess) e = launch(delta_kernel, dim3(192), dim3(256), size_t(0), lstate, out + kConvChannels);
        a.a_off = base + abytes, a.a_bytes = bbytes;
        if (e == cudaSuccess) e = launch(mixer_kernel, dim3(unsigned(sms)), dim3(kThreads), smem, a);
      } else {
        e = launch(mixer_kernel, dim3(unsigned(sms)), dim3(kThreads), smem, a);
      }
    }
    if (e != cudaSuccess) {
      std::printf("launch (mode %d): %s\n", mode, cudaGetErrorString(e));
      cudaStreamEndCapture(st, &g);
      return -1;
    }
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&exec, g, 0) != cudaSuccess) {
      std::printf("graph (mode %d): %s\n", mode, cudaGetErrorString(cudaGetLastError()));
      return -1;
    }
    const double ms = tm.ms([&] { cudaGraphLaunch(exec, st); }, 10);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    return ms;
  };
  auto report = [&](const char* what, double ms) {
    if (ms < 0) return;
    std::printf("%-62s %.3f ms = %.1f %% of the probe; %.2f us a layer (%.2f above its bytes)\n", what, ms,
                100.0 * floor_ms / ms, 1e3 * ms / kLayers, 1e3 * (ms - floor_ms) / kLayers);
  };
  for (int rep = 0; rep < 2; ++rep) {
    report("chain (4 launches a layer: qkv+z, conv, delta step, gdn_out)", chain(0));
    report("group (1 launch, 6 head groups, 2 group barriers)", chain(1));
    report("1bar (group, the site's exchange barrier left out)", chain(2));
    report("nobar (group, no barrier: its streaming ceiling)", chain(3));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
