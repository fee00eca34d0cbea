// The read-modify-write ceiling of a batched decode's recurrent states (round 22; not part of the build: compiled and run
// on the device by `nvcc -O3 -arch=sm_90a -Isrc tests/cuda/state_stream_probe.cu -o /tmp/ssp && /tmp/ssp`).
//
// Why: delta_rows_kernel reads and rewrites every sequence's fp32 GDN state once per step (B = 32: 1,536 states of
// 64 KB per layer, 201 MB of traffic) and measured 3.19 TB/s; a bulk-copy ring measured the same (round 21). This
// separates the access pattern's ceiling from the kernel: the same states, the same block shape (one 64 KB state per
// 256-thread block, 16 float4 a thread, all loads before any store), no arithmetic but one FMA, against cudaMemcpy and
// a grid-stride in-place kernel. Rates count the bytes read plus the bytes written.
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "probe_util.cuh"

// One block per state of F floats (F / 4 / blockDim float4 a thread): load all, then FMA and store all.
template <int PER>  // float4 per thread
__global__ __launch_bounds__(256) void state_rmw(float4* s, float a, float b) {
  float4* p = s + size_t(blockIdx.x) * 256 * PER;
  float4 v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) v[i] = p[threadIdx.x + 256 * i];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    v[i].x = v[i].x * a + b, v[i].y = v[i].y * a + b, v[i].z = v[i].z * a + b, v[i].w = v[i].w * a + b;
    p[threadIdx.x + 256 * i] = v[i];
  }
}

__global__ void grid_rmw(float4* s, size_t n, float a, float b) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float4 v = s[i];
    v.x = v.x * a + b, v.y = v.y * a + b, v.z = v.z * a + b, v.w = v.w * a + b;
    s[i] = v;
  }
}

int main() {
  constexpr size_t kStates = 1536, kStateBytes = 65536, kBytes = kStates * kStateBytes;  // 100.7 MB, > L2
  constexpr int kBufs = 4;  // rotated so that no launch finds its states in L2
  std::vector<float4*> buf(kBufs);
  float* sink;
  for (auto& p : buf) {
    CK(cudaMalloc(&p, kBytes));
    CK(cudaMemset(p, 0, kBytes));
  }
  CK(cudaMalloc(&sink, 4));
  float4* dst;
  CK(cudaMalloc(&dst, kBytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto time = [&](const char* name, double traffic, auto&& launch) {
    for (int w = 0; w < 3; ++w) launch(w % kBufs);
    CK(cudaDeviceSynchronize());
    constexpr int kReps = 40;
    CK(cudaEventRecord(e0));
    for (int r = 0; r < kReps; ++r) launch(r % kBufs);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = 1e3 * ms / kReps;
    std::printf("%-44s %8.2f us  %7.0f GB/s\n", name, us, traffic / (us * 1e-6) / 1e9);
    return 0;
  };
  const size_t n4 = kBytes / 16;
  time("read only, grid-stride (4 blocks/SM x 512)", double(kBytes),
       [&](int i) { read_only<<<sms * 4, 512>>>(buf[i], n4, sink); });
  time("cudaMemcpy D2D (read + write)", 2.0 * kBytes,
       [&](int i) { cudaMemcpyAsync(dst, buf[i], kBytes, cudaMemcpyDeviceToDevice); });
  time("in place, grid-stride (4 blocks/SM x 512)", 2.0 * kBytes,
       [&](int i) { grid_rmw<<<sms * 4, 512>>>(buf[i], n4, 1.0f, 0.f); });
  time("in place, grid-stride (16 blocks/SM x 128)", 2.0 * kBytes,
       [&](int i) { grid_rmw<<<sms * 16, 128>>>(buf[i], n4, 1.0f, 0.f); });
  time("one 64 KB state per block (16 float4 a thread)", 2.0 * kBytes,
       [&](int i) { state_rmw<16><<<kStates, 256>>>(buf[i], 1.0f, 0.f); });
  time("one 32 KB half state per block (8 float4)", 2.0 * kBytes,
       [&](int i) { state_rmw<8><<<kStates * 2, 256>>>(buf[i], 1.0f, 0.f); });
  time("one 16 KB quarter state per block (4 float4)", 2.0 * kBytes,
       [&](int i) { state_rmw<4><<<kStates * 4, 256>>>(buf[i], 1.0f, 0.f); });
  CK(cudaGetLastError());
  return 0;
}
