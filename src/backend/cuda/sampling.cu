// The top-k pick of sampling on the device (CudaBackend::top_k, Backend::top_k's contract): one block of
// 1024 threads per call walks the logits row x [n] (L2-resident: the head just wrote it):
//   1. the repetition penalty on the listed (distinct) tokens, in place;
//   2. a 4-pass radix select (8 bits a pass) of the k-th largest value's order key: keys with the
//      current prefix are histogrammed in shared memory (warp-aggregated atomics: most logits share
//      the top byte), the bucket where the running count from the top crosses k is the next digit;
//   3. a gather: every value above that key (any order), then the values equal to it in index order
//      (a per-tile ballot rank) until k are taken, so ties go to the lowest indices as on the host;
//   4. a bitonic sort of the <= 1024 candidates by (key descending, index ascending).
// Out: count (the row's non-NaN values) | ids [k] | values [k], one copy to the host.
// Why one block: the work is ~4 reads of a 1 MB row from L2 (~20-40 us), against a host copy of the row
// plus a host sort of 248k logits per token; more blocks would need a grid-wide select.
#include "backend/cuda/common.cuh"

namespace bonsai::cuda {

namespace {

constexpr int kTopKThreads = 1024;
constexpr int kTopKWarps = kTopKThreads / 32;
static_assert(kMaxTopK == kTopKThreads, "one candidate slot per thread (padding, sort)");

struct TopKArgs {
  float* x;
  int32_t* out;  // [1 + 2k]: count | ids | values (as float bits)
  int64_t n;
  int32_t k, n_pen;
  float penalty;
  int32_t pad;
  int32_t pen[kMaxTopKPenalized];
};

// Larger value -> larger key; -0 and +0 are one key (the host compares them equal and orders by index).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t u = v == 0.f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ __launch_bounds__(kTopKThreads) void top_k_kernel(const TopKArgs a) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_eq[kTopKWarps];
  __shared__ unsigned long long cand[kMaxTopK];  // (key << 32) | (0xFFFFFFFF - index): one descending order
  __shared__ uint32_t s_digit, s_total;
  __shared__ int32_t s_remaining, s_gt, s_eq_seen;
  __shared__ bool s_done;
  pdl_trigger();
  pdl_wait();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* x = a.x;

  for (int i = tid; i < a.n_pen; i += kTopKThreads) {  // backend.h repetition_penalised, on the device
    const float v = x[a.pen[i]];
    x[a.pen[i]] = v > 0.f ? v / a.penalty : v * a.penalty;
  }
  __syncthreads();  // the block's global writes are visible to the block past the barrier

  // ---- radix select of the k-th largest key among the non-NaN values
  uint32_t prefix = 0, mask = 0;
  int32_t remaining = a.k;  // how many of the still-undecided keys (those with `prefix`) to take
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kTopKThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = tid; i < a.n; i += kTopKThreads) {
      const float v = x[i];
      if (isnan(v)) continue;
      const uint32_t key = order_key(v);
      if ((key & mask) != prefix) continue;
      const uint32_t bucket = (key >> shift) & 255u;
      const unsigned peers = __match_any_sync(__activemask(), bucket);
      if (lane == __ffs(peers) - 1) atomicAdd(&hist[bucket], uint32_t(__popc(peers)));
    }
    __syncthreads();
    if (tid == 0) {
      if (shift == 24) {  // all non-NaN values are in this first histogram
        uint32_t total = 0;
        for (int b = 0; b < 256; ++b) total += hist[b];
        s_total = total;
        if (uint32_t(remaining) > total) remaining = int32_t(total);  // fewer than k: take them all
      }
      uint32_t above = 0;
      int b = 255;
      for (; b > 0; --b) {
        if (above + hist[b] >= uint32_t(remaining)) break;
        above += hist[b];
      }
      s_digit = uint32_t(b);
      s_remaining = remaining - int32_t(above);
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 255u << shift;
    remaining = s_remaining;
  }
  const int32_t k = a.k < int32_t(s_total) ? a.k : int32_t(s_total);
  if (tid == 0) a.out[0] = int32_t(s_total);
  if (k == 0) return;
  const uint32_t kth = prefix;            // the k-th largest key
  const int32_t n_gt = k - remaining;     // keys above it: all taken; `remaining` equal ones in index order

  // ---- gather
  if (tid == 0) {
    s_gt = 0;
    s_eq_seen = 0;
  }
  cand[tid] = 0ull;  // padding sorts last (a real key is never 0: that would be a NaN's bits)
  __syncthreads();
  for (int64_t base = 0; base < a.n; base += kTopKThreads) {
    const int64_t i = base + tid;
    bool eq = false;
    uint32_t key = 0;
    if (i < a.n) {
      const float v = x[i];
      if (!isnan(v)) {
        key = order_key(v);
        if (key > kth) cand[atomicAdd(&s_gt, 1)] = (uint64_t(key) << 32) | (0xFFFFFFFFu - uint32_t(i));
        eq = key == kth;
      }
    }
    const unsigned bal = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) warp_eq[warp] = uint32_t(__popc(bal));
    __syncthreads();
    uint32_t before = 0, tile = 0;
    for (int w = 0; w < kTopKWarps; ++w) {
      before += w < warp ? warp_eq[w] : 0u;
      tile += warp_eq[w];
    }
    const int32_t rank = s_eq_seen + int32_t(before) + __popc(bal & ((1u << lane) - 1u));
    if (eq && rank < remaining) cand[n_gt + rank] = (uint64_t(key) << 32) | (0xFFFFFFFFu - uint32_t(i));
    __syncthreads();  // everyone has read s_eq_seen and warp_eq, every atomicAdd on s_gt is in
    if (tid == 0) {
      s_eq_seen += int32_t(tile);
      s_done = s_eq_seen >= remaining && s_gt == n_gt;
    }
    __syncthreads();
    if (s_done) break;  // uniform: thread 0 writes it again only past the next tile's first barrier
  }

  // ---- bitonic sort, descending
  for (int size = 2; size <= kMaxTopK; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      const int j = tid ^ stride;
      if (j > tid) {
        const unsigned long long p = cand[tid], q = cand[j];
        const bool first_half_desc = (tid & size) == 0;
        if (first_half_desc ? p < q : p > q) {
          cand[tid] = q;
          cand[j] = p;
        }
      }
    }
  __syncthreads();
  if (tid < k) {
    const int32_t idx = int32_t(0xFFFFFFFFu - uint32_t(cand[tid] & 0xFFFFFFFFull));
    a.out[1 + tid] = idx;
    a.out[1 + a.k + tid] = __float_as_int(x[idx]);
  }
}

}  // namespace

Launch top_k_launch(float* x, int64_t n, int32_t k, float penalty, const int32_t* penalized, int32_t n_pen,
                    int32_t* out) {
  TopKArgs a{};
  a.x = x;
  a.out = out;
  a.n = n;
  a.k = k;
  a.n_pen = n_pen;
  a.penalty = penalty;
  for (int32_t i = 0; i < n_pen; ++i) a.pen[i] = penalized[i];
  return make_launch(reinterpret_cast<const void*>(&top_k_kernel), dim3(1), dim3(kTopKThreads), 0, a);
}

}  // namespace bonsai::cuda
