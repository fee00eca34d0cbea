// CPU softmax attention. One work item = one query row x one KV head x a block of the query heads that
// share that KV head (GQA): each K and V row is read once for the whole block of heads, which matters
// when the KV cache is long and memory bound. Blocks are split smaller only when there would otherwise
// be fewer work items than ~2 per thread.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/thread_pool.h"
#include "util/error.h"

namespace bonsai::cpu {
namespace {

// hb query heads (rows of q and out, D apart) against positions 0..nv-1 of KV head kvh.
void attend_heads(const float* q, int64_t hb, const float* k_cache, const float* v_cache, int64_t nv, int64_t Hkv,
                  int64_t kvh, int64_t D, float scale, float* out) {
  const auto dot = kernels().dot;
  float* s = scratch(size_t(hb * nv), 0);  // [hb, nv] scores, then probabilities
  for (int64_t t = 0; t < nv; ++t) {
    const float* kt = k_cache + (t * Hkv + kvh) * D;
    for (int64_t h = 0; h < hb; ++h) s[h * nv + t] = dot(q + h * D, kt, D) * scale;
  }
  for (int64_t h = 0; h < hb; ++h) {
    float* sh = s + h * nv;
    float mx = sh[0];
    for (int64_t t = 1; t < nv; ++t) mx = std::max(mx, sh[t]);
    float sum = 0.0f;
    for (int64_t t = 0; t < nv; ++t) sum += (sh[t] = std::exp(sh[t] - mx));
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < nv; ++t) sh[t] *= inv;
    std::fill(out + h * D, out + (h + 1) * D, 0.0f);
  }
  for (int64_t t = 0; t < nv; ++t) {
    const float* vt = v_cache + (t * Hkv + kvh) * D;
    for (int64_t h = 0; h < hb; ++h) {
      const float p = s[h * nv + t];
      float* o = out + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] += p * vt[d];
    }
  }
}

void attend(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0, int64_t Hq,
            int64_t Hkv, int64_t D, float scale, float* out) {
  if (Hkv <= 0 || Hq % Hkv != 0) fail("attention: Hq = {} is not a multiple of Hkv = {}", Hq, Hkv);
  const int64_t rep = Hq / Hkv;
  const int64_t want = 2 * num_threads();
  const int64_t splits = std::min<int64_t>(rep, std::max<int64_t>(1, (want + M * Hkv - 1) / (M * Hkv)));
  const int64_t hb = (rep + splits - 1) / splits;  // heads per work item
  const int64_t nblk = (rep + hb - 1) / hb;
  parallel_for(0, M * Hkv * nblk, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t m = u / (Hkv * nblk), kvh = (u / nblk) % Hkv, blk = u % nblk;
      const int64_t h0 = kvh * rep + blk * hb, nh = std::min(hb, rep - blk * hb);
      attend_heads(q + (m * Hq + h0) * D, nh, k_cache, v_cache, p0 + m + 1, Hkv, kvh, D, scale,
                   out + (m * Hq + h0) * D);
    }
  });
}

}  // namespace

void attention_decode(const float* q, const float* k_cache, const float* v_cache, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t D, float scale, float* out) {
  attend(q, k_cache, v_cache, 1, T - 1, Hq, Hkv, D, scale, out);
}

void attention_prefill(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0,
                       int64_t Hq, int64_t Hkv, int64_t D, float scale, float* out) {
  attend(q, k_cache, v_cache, M, p0, Hq, Hkv, D, scale, out);
}

}  // namespace bonsai::cpu
