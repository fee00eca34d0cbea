// CPU softmax attention. One work item = one query row x one KV head x a block of the query heads that
// share that KV head (GQA): each K and V row is read once for the whole block of heads, which matters
// when the KV cache is long and memory bound. Blocks are split smaller only when there would otherwise
// be fewer work items than ~2 per thread.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec.h"
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
    const float sum = vec::exp_shift_sum(sh, nv, mx);
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < nv; ++t) sh[t] *= inv;
    std::fill(out + h * D, out + (h + 1) * D, 0.0f);
  }
  for (int64_t t = 0; t < nv; ++t) {
    const float* vt = v_cache + (t * Hkv + kvh) * D;
    for (int64_t h = 0; h < hb; ++h) vec::axpy(s[h * nv + t], vt, out + h * D, D);  // V row in L1 for all hb heads
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

// Decode over a long cache, split by positions (the "flash decoding" order): one work item = a span of
// kSpan positions x ALL heads, so a thread streams contiguous cache rows (position t's K row holds every
// KV head: Hkv * D floats) instead of reading D floats out of every Hkv * D (a 4 KB stride at the 27B
// shape, which defeats the hardware prefetcher: 1.8 GB/s measured). Per span and head: the max score m,
// l = sum e^{s - m} and the unnormalised o = sum e^{s - m} v; the spans merge with the log-sum-exp rule.
constexpr int64_t kSpan = 256;

void attend_split(const float* q, const float* k_cache, const float* v_cache, int64_t T, int64_t Hq, int64_t Hkv,
                  int64_t D, float scale, float* out) {
  const int64_t row = Hkv * D, nspan = (T + kSpan - 1) / kSpan;
  // Partials of every span: o [nspan, Hq, D], m and l [nspan, Hq]. Grown once, owned by the calling thread.
  thread_local std::vector<float> part;
  if (part.size() < size_t(nspan * Hq * (D + 2))) part.resize(size_t(nspan * Hq * (D + 2)));
  float* po = part.data();
  float* pm = po + nspan * Hq * D;
  float* pl = pm + nspan * Hq;
  parallel_for(0, nspan, 1, [&](int64_t lo, int64_t hi) {
    float* s = scratch(size_t(Hq * kSpan), 0);  // [Hq, kSpan] scores, then e^{s - m}
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t t0 = c * kSpan, len = std::min(kSpan, T - t0);
      vec::attend_span(q, k_cache + t0 * row, v_cache + t0 * row, len, Hq, Hkv, D, scale, s, kSpan, pm + c * Hq,
                       pl + c * Hq, po + c * Hq * D);
    }
  });
  for (int64_t h = 0; h < Hq; ++h) {
    float mx = pm[h];
    for (int64_t c = 1; c < nspan; ++c) mx = std::max(mx, pm[c * Hq + h]);
    float l = 0.0f;
    float* oh = out + h * D;
    std::fill(oh, oh + D, 0.0f);
    for (int64_t c = 0; c < nspan; ++c) {
      const float w = std::exp(pm[c * Hq + h] - mx);
      l += w * pl[c * Hq + h];
      vec::axpy(w, po + (c * Hq + h) * D, oh, D);
    }
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < D; ++d) oh[d] *= inv;
  }
}

}  // namespace

void attention_decode(const float* q, const float* k_cache, const float* v_cache, int64_t T, int64_t Hq,
                      int64_t Hkv, int64_t D, float scale, float* out) {
  if (Hkv <= 0 || Hq % Hkv != 0) fail("attention: Hq = {} is not a multiple of Hkv = {}", Hq, Hkv);
  // Short caches fit in cache anyway: the head-blocked order there (no merge pass).
  if (T >= 2 * kSpan) attend_split(q, k_cache, v_cache, T, Hq, Hkv, D, scale, out);
  else attend(q, k_cache, v_cache, 1, T - 1, Hq, Hkv, D, scale, out);
}

void attention_prefill(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0,
                       int64_t Hq, int64_t Hkv, int64_t D, float scale, float* out) {
  attend(q, k_cache, v_cache, M, p0, Hq, Hkv, D, scale, out);
}

}  // namespace bonsai::cpu
