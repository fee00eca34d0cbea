// What the standalone device probes share (tests/cuda/*_probe.cu; not part of the build, compiled on the device by
// device_round21.sh): the CUDA-call check of main() and the plain-load read stream they measure against.
#pragma once
#include <cstddef>
#include <cstdio>

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
