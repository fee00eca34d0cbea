// CPU Gated DeltaNet ops. The recurrent state stays fp32 in the caller's buffer; work is split over V
// heads (each head's [Dk, Dv] state is independent), channels (conv) or elements (gates).
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec.h"
#include "util/error.h"

namespace bonsai::cpu {
namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20

void check_heads(int64_t Nk, int64_t Nv) {
  if (Nk <= 0 || Nv % Nk != 0) fail("gdn: Nv = {} is not a multiple of Nk = {}", Nv, Nk);
}

// y[0..n) += a * x[0..n)
inline void axpy(float a, const float* x, float* y, int64_t n) { vec::axpy(a, x, y, n); }

}  // namespace

void gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc, float* out) {
  const int64_t P = Kc - 1;
  const int64_t grain = std::max<int64_t>(16, 32768 / std::max<int64_t>(1, T * Kc));
  parallel_for(0, C, grain, [&](int64_t lo, int64_t hi) {
    // in(s, c): the input sequence = P state rows then the T new rows.
    auto in_row = [&](int64_t s) { return s < P ? conv_state + s * C : x + (s - P) * C; };
    for (int64_t t = 0; t < T; ++t) {
      float* o = out + t * C;
      for (int64_t c = lo; c < hi; ++c) o[c] = 0.0f;
      for (int64_t j = 0; j < Kc; ++j) {
        const float* src = in_row(t + j);
        for (int64_t c = lo; c < hi; ++c) o[c] += taps[c * Kc + j] * src[c];
      }
      vec::silu(o + lo, hi - lo);
    }
    // New state row r = input T + r. Ascending r only reads rows not yet overwritten (T + r > r).
    for (int64_t r = 0; r < P; ++r) {
      const float* src = in_row(T + r);
      float* dst = conv_state + r * C;
      if (src != dst)
        for (int64_t c = lo; c < hi; ++c) dst[c] = src[c];
    }
  });
}

void gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
               float* g, float* beta) {
  parallel_for(0, T, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, Nv)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t h = 0; h < Nv; ++h) {
        const int64_t i = t * Nv + h;
        beta[i] = sigmoid(b[i]);
        g[i] = A[h] * softplus(a[i] + dt_bias[h]);
      }
  });
}

void gdn_recurrent(float* state, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv, float* out) {
  check_heads(Nk, Nv);
  const int64_t rep = Nv / Nk;
  parallel_for(0, Nv, 1, [&](int64_t lo, int64_t hi) {
    float* kv = scratch(size_t(2 * Dv), 0);  // [2, Dv] the step's column-tail scratch
    for (int64_t h = lo; h < hi; ++h) {
      const int64_t kh = h / rep;
      float* S = state + h * Dk * Dv;  // [Dk, Dv]
      for (int64_t t = 0; t < T; ++t) {
        // kv = (e^g S)^T k = e^g (S^T k); delta = beta (v - kv); S = e^g S + k delta^T; o = S^T q.
        vec::gdn_step_head(S, q + (t * Nk + kh) * Dk, k + (t * Nk + kh) * Dk, v + (t * Nv + h) * Dv,
                           std::exp(g[t * Nv + h]), beta[t * Nv + h], Dk, Dv, out + (t * Nv + h) * Dv, kv);
      }
    }
  });
}

void gdn_chunked(float* state, const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv, float* out, int64_t chunk) {
  check_heads(Nk, Nv);
  if (chunk < 1) fail("gdn_chunked: chunk = {} must be >= 1", chunk);
  const int64_t rep = Nv / Nk;
  const int64_t C = chunk;
  const auto dot = kernels().dot;
  parallel_for(0, Nv, 1, [&](int64_t lo, int64_t hi) {
    // Per-thread scratch: Gam, eG, bg [C]; A (then T) and QK [C, C]; W [C, Dk]; U, Vp [C, Dv].
    float* Gam = scratch(size_t(3 * C + 2 * C * C + C * Dk + 2 * C * Dv), 0);
    float* eG = Gam + C;
    float* decL = eG + C;
    float* Tm = decL + C;
    float* QK = Tm + C * C;
    float* W = QK + C * C;
    float* U = W + C * Dk;
    float* Vp = U + C * Dv;
    for (int64_t h = lo; h < hi; ++h) {
      const int64_t kh = h / rep;
      float* S = state + h * Dk * Dv;  // [Dk, Dv], S0 of each chunk
      for (int64_t t0 = 0; t0 < T; t0 += C) {
        const int64_t L = std::min(C, T - t0);
        auto Qr = [&](int64_t r) { return q + ((t0 + r) * Nk + kh) * Dk; };
        auto Kr = [&](int64_t r) { return k + ((t0 + r) * Nk + kh) * Dk; };
        auto Vr = [&](int64_t r) { return v + ((t0 + r) * Nv + h) * Dv; };
        auto Br = [&](int64_t r) { return beta[(t0 + r) * Nv + h]; };
        float run = 0.0f;
        for (int64_t r = 0; r < L; ++r) {
          Gam[r] = (run += g[(t0 + r) * Nv + h]);
          eG[r] = std::exp(Gam[r]);
        }
        for (int64_t r = 0; r < L; ++r) decL[r] = std::exp(Gam[L - 1] - Gam[r]);
        // A[r][j] = beta_r e^{Gam_r - Gam_j} k_r.k_j (j < r); QK[r][j] = q_r.k_j e^{Gam_r - Gam_j} (j <= r).
        // e^{Gam_r - Gam_j} is computed as one exp of a non-positive number (never a ratio of underflowed exps).
        // T = (I + A)^-1 (unit lower triangular) by forward substitution, row r: T[r] = e_r - sum_{j<r}
        // A[r][j] T[j]; A[r] is consumed as T[r] is built, so both share storage.
        for (int64_t r = 0; r < L; ++r) {
          float* Ar = Tm + r * C;
          for (int64_t j = 0; j < r; ++j) Ar[j] = Br(r) * std::exp(Gam[r] - Gam[j]) * dot(Kr(r), Kr(j), Dk);
          for (int64_t j = 0; j <= r; ++j) QK[r * C + j] = dot(Qr(r), Kr(j), Dk) * std::exp(Gam[r] - Gam[j]);
          // In place, ascending c: T[r][c] = -sum_{j=c}^{r-1} A[r][j] T[j][c] only reads A[r][j] for j >= c,
          // so overwriting A[r][c] with T[r][c] loses nothing still needed.
          for (int64_t c = 0; c < r; ++c) {
            float acc = 0.0f;
            for (int64_t j = c; j < r; ++j) acc -= Ar[j] * Tm[j * C + c];
            Ar[c] = acc;
          }
          Ar[r] = 1.0f;
        }
        // W = T diag(beta e^Gam) K, U = T diag(beta) V.
        for (int64_t r = 0; r < L; ++r) {
          float* Wr = W + r * Dk;
          float* Ur = U + r * Dv;
          std::fill(Wr, Wr + Dk, 0.0f);
          std::fill(Ur, Ur + Dv, 0.0f);
          for (int64_t c = 0; c <= r; ++c) {
            const float tb = Tm[r * C + c] * Br(c);
            axpy(tb * eG[c], Kr(c), Wr, Dk);
            axpy(tb, Vr(c), Ur, Dv);
          }
        }
        // V' = U - W S0;  O = e^Gam Q S0 + (QK ⊙ decay) V'.
        for (int64_t r = 0; r < L; ++r) {
          float* Vpr = Vp + r * Dv;
          std::copy(U + r * Dv, U + (r + 1) * Dv, Vpr);
          const float* Wr = W + r * Dk;
          for (int64_t i = 0; i < Dk; ++i) axpy(-Wr[i], S + i * Dv, Vpr, Dv);
        }
        for (int64_t r = 0; r < L; ++r) {
          float* o = out + ((t0 + r) * Nv + h) * Dv;
          std::fill(o, o + Dv, 0.0f);
          const float* qr = Qr(r);
          for (int64_t i = 0; i < Dk; ++i) axpy(qr[i], S + i * Dv, o, Dv);
          for (int64_t j = 0; j < Dv; ++j) o[j] *= eG[r];
          for (int64_t j = 0; j <= r; ++j) axpy(QK[r * C + j], Vp + j * Dv, o, Dv);
        }
        // S = e^{Gam_L} S0 + sum_r e^{Gam_L - Gam_r} k_r V'_r^T.
        const float eL = eG[L - 1];
        for (int64_t i = 0; i < Dk; ++i) {
          float* Si = S + i * Dv;
          for (int64_t j = 0; j < Dv; ++j) Si[j] *= eL;
          for (int64_t r = 0; r < L; ++r) axpy(decL[r] * Kr(r)[i], Vp + r * Dv, Si, Dv);
        }
      }
    }
  });
}

}  // namespace bonsai::cpu
