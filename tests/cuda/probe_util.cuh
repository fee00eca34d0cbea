// What the standalone device probes share (tests/cuda/*_probe.cu; not part of the build, compiled on the device by
// device_round21.sh): the CUDA-call check of main() and the plain-load read stream they measure against.
#pragma once
#include <cstddef>
#include <cstdio>
#include <utility>

#include <cuda_runtime.h>

// In main(): print the failed call and return 1.
#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

// A grid-stride float4 read of s [n] (the read probe's pattern); the sum is stored only when it is a value it never is.
__global__ void read_only(const float4* s, size_t n, float* sink) {
  float acc = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = s[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 1234.5f) *sink = acc;  // never: keeps the loads
}

// The mean ms of `reps` runs of run() on stream st, after two warm-ups, between events e0 and e1 (the probes' timing);
// -1 after a CUDA error, which it prints.
template <class F>
double time_events_ms(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, F&& run, int reps) {
  auto ok = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return e == cudaSuccess;
  };
  run();
  run();
  if (!ok(cudaStreamSynchronize(st), "warm-up") || !ok(cudaEventRecord(e0, st), "event")) return -1;
  for (int r = 0; r < reps; ++r) run();
  float ms = 0;
  if (!ok(cudaEventRecord(e1, st), "event") || !ok(cudaEventSynchronize(e1), "timed runs") ||
      !ok(cudaEventElapsedTime(&ms, e0, e1), "elapsed") || !ok(cudaGetLastError(), "launch"))
    return -1;
  return double(ms) / reps;
}

// The probes' timing rig: a stream and two events. ms(run, reps): time_events_ms on them; read_ms: the plain-load read
// probe over `bytes` at w (the rate every probe reports against).
struct ProbeTimer {
  cudaStream_t st = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaError_t init() {
    cudaError_t e = cudaStreamCreate(&st);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    return e;
  }
  template <class F>
  double ms(F&& run, int reps) const {
    return time_events_ms(st, e0, e1, run, reps);
  }
  double read_ms(const void* w, size_t bytes, int sms, float* fsink) const {
    return ms([&] { read_only<<<4 * sms, 512, 0, st>>>(static_cast<const float4*>(w), bytes / 16, fsink); }, 5);
  }
};

// A launch with the programmatic-serialization attribute (PDL: the next kernel may start before this one ends and
// waits at its griddepcontrol.wait), as the backend launches its kernels.
template <class... Exp, class... Act>
cudaError_t launch_pdl(cudaStream_t st, void (*kernel)(Exp...), dim3 grid, dim3 block, size_t smem, Act&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Act>(args)...);
}
