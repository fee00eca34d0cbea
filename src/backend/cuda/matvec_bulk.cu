// Ternary matvec v4 (decode, M = 1): weights streamed by the bulk-copy engine (TMA, cp.async.bulk) into a
// per-warp ring of shared-memory stages, issued before the kernel waits on its predecessor.
//
// Why (docs/cuda-kernels.md, "Ternary matvec v4"): v3 kept its loads in flight in a register ring, so
// each block filled the register file (128 regs x 512 threads x 2 blocks per SM) and the next kernel could
// not become resident until this one drained: every matvec paid its ramp (fill, one DRAM latency, drain)
// alone, ~8 us per launch. Here a warp keeps kStages x R x 544 B in flight with ONE thread issuing
// 2R bulk copies per stage; registers stay ~64 and the block takes ~90 KB of shared memory, so the
// NEXT matvec's block fits beside it on the SM (programmatic dependent launch) and streams its first
// stages while this one finishes.
//
// Work: rows are grouped R at a time (R = 4, 2 or 1, chosen at launch for balance); each warp owns a
// contiguous range of row groups and walks each group in slices of 32 chunks (a chunk = 64 weights =
// 16 B of words; a slice = 512 B of each row + 32 B of its scales). Lane l takes chunk 32 s + l of the
// slice. The activation (int8, the site kernel's transposed layout) is copied once per block into shared
// memory as four planes xs[k][c] = bytes 16k..16k+15 of chunk c, so a warp's 32 lanes read 32
// consecutive 16-byte pieces: no bank conflicts.
//
// Contract: K % 1024 == 0 (every slice of scales is a multiple of 16 bytes, as bulk copies need), M = 1.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ternary_dot.cuh"
#include "backend/cuda/mbarrier.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kBulkWarps = 8;                 // consumer warps; one more warp issues the copies
constexpr int kStages = 4;
constexpr int64_t kTileBytes = 20480;         // words per stage (a tile of rows, one bulk copy)
constexpr int64_t kBulkMaxK = 32768;

struct BulkOut {
  const uint32_t* words;   // [N, K/16]
  const uint16_t* scales;  // [N, K/128] fp16
  float* y;                // [N]
  int64_t N;
  int64_t t0;              // first tile of this output
};
struct BulkArgs {
  BulkOut o[kMaxOuts];
  const int8_t* xq;    // [K] transposed int8 activation
  const float2* xds;   // [K/64] {scale, sum of q} per chunk
  int64_t K;
  int64_t total;       // tiles in all
  int64_t per_block;   // tiles per block (a contiguous range)
  int32_t n_outs, rows;  // rows per tile (TR)
  int32_t early, pad;    // tiles issued before waiting on the previous kernel (<= kStages)
};


__device__ __forceinline__ int output_of_tile(const BulkArgs& a, int64_t t) {
  int o = 0;
#pragma unroll
  for (int i = 1; i < kMaxOuts; ++i)
    if (i < a.n_outs && t >= a.o[i].t0) o = i;
  return o;
}

// Tile geometry: TR = rows per tile; a row is split over P = 8 * RPW / TR... expressed per warp as
// RPW rows (RPW >= 1, P = 1) or one row shared by P warps (RPW = 1, P > 1).
template <int RPW>
__global__ __launch_bounds__((kBulkWarps + 1) * 32, 1) void matvec_bulk_kernel(const BulkArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int64_t C = a.K >> 6;  // chunks (64 weights, 16 B of words) per row
  const int TR = a.rows;
  const int64_t words_bytes = int64_t(TR) * (a.K >> 2), scale_bytes = int64_t(TR) * (a.K >> 6);
  // Shared memory: [kStages] x (words [TR, K/16] | scales [TR, K/128]) | full[kStages], empty[kStages] |
  // xs planes [4][C] int4 | xds [C] float2 | partial sums [kBulkWarps][RPW] float
  const int64_t stage_bytes = words_bytes + scale_bytes;
  unsigned char* stage0 = smem;
  auto* full = reinterpret_cast<uint64_t*>(smem + stage_bytes * kStages);
  uint64_t* empty = full + kStages;
  auto* xs = reinterpret_cast<int4*>(empty + kStages);
  auto* xd = reinterpret_cast<float2*>(xs + 4 * C);
  auto* part = reinterpret_cast<float*>(xd + C);

  const int64_t t_begin = int64_t(blockIdx.x) * a.per_block;
  const int64_t t_end = min(a.total, t_begin + a.per_block);
  const int64_t n_tiles = t_end - t_begin;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kBulkWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_trigger();

  if (wib == kBulkWarps) {  // ---- producer: one thread streams the tiles, kStages ahead -------------
    if (lane == 0) {
      for (int64_t i = 0; i < n_tiles; ++i) {
        // The first `early` tiles stream while the previous kernel drains; the rest wait for it, so a
        // kernel that is still running does not queue behind this one's prefetch in the copy engine.
        if (i == a.early) pdl_wait();
        const int s = int(i % kStages);
        if (i >= kStages) mbar_wait(&empty[s], unsigned(((i / kStages) - 1) & 1));
        const int64_t t = t_begin + i;
        const BulkOut& O = a.o[output_of_tile(a, t)];
        const int64_t row = (t - O.t0) * TR;
        const int64_t nrows = min(int64_t(TR), O.N - row);
        unsigned char* st = stage0 + s * stage_bytes;
        mbar_expect_tx(&full[s], unsigned(nrows * ((a.K >> 2) + (a.K >> 6))));
        bulk_load(st, reinterpret_cast<const unsigned char*>(O.words) + row * (a.K >> 2), unsigned(nrows * (a.K >> 2)),
                  &full[s]);
        bulk_load(st + words_bytes, reinterpret_cast<const unsigned char*>(O.scales) + row * (a.K >> 6),
                  unsigned(nrows * (a.K >> 6)), &full[s]);
      }
    }
    pdl_wait();  // (again, harmless) keeps "this kernel finished" implying "its predecessor finished"
    return;
  }

  // ---- consumers ----------------------------------------------------------------------------------
  pdl_wait();  // the activation and y depend on earlier kernels; the weights above do not
  for (int64_t c = threadIdx.x; c < C; c += kBulkWarps * 32) {
    const int4* src = reinterpret_cast<const int4*>(a.xq) + c * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) xs[k * C + c] = src[k];
    xd[c] = a.xds[c];
  }
  asm volatile("bar.sync 1, %0;" ::"n"(kBulkWarps * 32) : "memory");  // consumers only

  // This warp's rows of a tile and its chunk range of them.
  const int P = RPW == 1 ? kBulkWarps / TR : 1;  // warps per row
  const int r0 = RPW == 1 ? wib / P : wib * RPW;
  const int part_id = RPW == 1 ? wib % P : 0;
  const int64_t c_lo = C * part_id / P, c_hi = C * (part_id + 1) / P;

  for (int64_t i = 0; i < n_tiles; ++i) {
    const int s = int(i % kStages);
    mbar_wait(&full[s], unsigned((i / kStages) & 1));
    const unsigned char* st = stage0 + s * stage_bytes;
    const uint4* W = reinterpret_cast<const uint4*>(st);                   // [TR, C] chunks
    const __half* S = reinterpret_cast<const __half*>(st + words_bytes);  // [TR, C/2]
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) acc[r] = 0.f;
    for (int64_t c = c_lo + lane; c < c_hi; c += 32) {
      const int4 x0 = xs[c], x1 = xs[C + c], x2 = xs[2 * C + c], x3 = xs[3 * C + c];
      const float2 ds = xd[c];
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const int64_t rr = r0 + r;
        acc[r] += __half2float(S[rr * (C / 2) + (c >> 1)]) * ds.x * (float(chunk_dot(W[rr * C + c], x0, x1, x2, x3)) - ds.y);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done reading stage s
    const int64_t t = t_begin + i;
    const BulkOut& O = a.o[output_of_tile(a, t)];
    const int64_t row = (t - O.t0) * TR;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const float v = warp_sum(acc[r]);  // rows past N computed from stale bytes: never written
      if (P == 1) {
        if (lane == 0 && row + r0 + r < O.N) O.y[row + r0 + r] = v;
      } else if (lane == 0) {
        part[wib] = v;
      }
    }
    if (P > 1) {  // the row's P warps are adjacent: the first adds the others' partial sums
      asm volatile("bar.sync 1, %0;" ::"n"(kBulkWarps * 32) : "memory");
      if (part_id == 0 && lane == 0 && row + r0 < O.N) {
        float v = 0.f;
        for (int p = 0; p < P; ++p) v += part[wib + p];
        O.y[row + r0] = v;
      }
      asm volatile("bar.sync 1, %0;" ::"n"(kBulkWarps * 32) : "memory");  // part[] free for the next tile
    }
  }
}

template <int RPW>
const void* bulk_kernel() {
  return reinterpret_cast<const void*>(&matvec_bulk_kernel<RPW>);
}

size_t bulk_smem_bytes(int64_t K, int TR) {
  const int64_t C = K / 64;
  return size_t(kStages * TR * (K / 4 + K / 64) + 16 * kStages + C * 64 + C * 8 + kBulkWarps * 8 * 4);
}

}  // namespace

bool matvec_bulk_supported(int64_t K, int64_t M) { return M == 1 && K > 0 && K % 1024 == 0 && K <= kBulkMaxK; }

void init_matvec_bulk_attributes() {
  // The opt-in above 48 KB of dynamic shared memory, once per kernel: the largest tile any K gets is
  // kTileBytes of words plus scales, times the stages.
  const int most = int(kStages * (kTileBytes + kTileBytes / 16) + 16 * kStages + kBulkMaxK * 9 / 8 + kBulkWarps * 32);
  for (const void* f : {bulk_kernel<1>(), bulk_kernel<2>(), bulk_kernel<4>(), bulk_kernel<8>()})
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
}

Launch matvec_bulk_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int sms,
                          int rows, int early) {
  // Tile rows TR: as many as fit kTileBytes of words; 8 consumer warps take RPW = TR / 8 rows each, or
  // share a row (TR < 8: P = 8 / TR warps per row). Fewer rows per tile when the tiles would not spread
  // over the SMs within ~12 % of balance (small matrices), unless the caller fixed rows per warp.
  const int64_t row_bytes = K / 4;
  int TR = 1;
  while (TR < 64 && (2 * TR) * row_bytes <= kTileBytes) TR *= 2;
  auto tiles_for = [&](int tr) {
    int64_t t = 0;
    for (int i = 0; i < n_outs; ++i) t += (outs[i].N + tr - 1) / tr;
    return t;
  };
  if (rows == 1 || rows == 2 || rows == 4 || rows == 8) {
    TR = std::min<int>(TR, rows * kBulkWarps);
  } else {
    while (TR > 1) {
      const int64_t t = tiles_for(TR), per = (t + sms - 1) / sms;
      if (double(t) >= 0.88 * double(per) * double(sms)) break;
      TR /= 2;
    }
  }
  BulkArgs a{};
  a.xq = xq;
  a.xds = xds;
  a.K = K;
  a.n_outs = n_outs;
  a.rows = TR;
  a.early = std::clamp(early, 0, kStages);
  int64_t t0 = 0;
  for (int i = 0; i < n_outs; ++i) {
    a.o[i] = {outs[i].words, outs[i].scales, outs[i].y, outs[i].N, t0};
    t0 += (outs[i].N + TR - 1) / TR;
  }
  a.total = t0;
  a.per_block = (a.total + sms - 1) / sms;
  const dim3 grid(unsigned((a.total + a.per_block - 1) / a.per_block));
  const dim3 block((kBulkWarps + 1) * 32);
  const uint32_t smem = uint32_t(bulk_smem_bytes(K, TR));
  const int rpw = TR >= kBulkWarps ? TR / kBulkWarps : 1;
  const void* f = rpw >= 8 ? bulk_kernel<8>() : rpw == 4 ? bulk_kernel<4>() : rpw == 2 ? bulk_kernel<2>() : bulk_kernel<1>();
  return make_launch(f, grid, block, smem, a);
}

}  // namespace bonsai::cuda
