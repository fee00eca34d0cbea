// Reference Gated DeltaNet ops, in double. Within one call the recurrent state is carried in double and
// stored back to the fp32 state buffer at the end of the call.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/ref/ops.h"
#include "util/error.h"

namespace bonsai::ref {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }  // torch's threshold 20

void check_heads(int64_t Nk, int64_t Nv) {
  if (Nk <= 0 || Nv % Nk != 0) fail("gdn: Nv = {} is not a multiple of Nk = {}", Nv, Nk);
}

}  // namespace

void gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc, float* out) {
  const int64_t P = Kc - 1;
  // The full input sequence: P state rows then T new rows. in(s) for s in [0, P + T).
  auto in = [&](int64_t s, int64_t c) -> double { return s < P ? conv_state[s * C + c] : x[(s - P) * C + c]; };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < Kc; ++j) acc += double(taps[c * Kc + j]) * in(t + j, c);  // s = (P + t) - P + j
      out[t * C + c] = float(silu(acc));
    }
  std::vector<float> last(size_t(P * C));
  for (int64_t r = 0; r < P; ++r)
    for (int64_t c = 0; c < C; ++c) last[size_t(r * C + c)] = float(in(T + r, c));
  for (int64_t i = 0; i < P * C; ++i) conv_state[i] = last[size_t(i)];
}

void gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
               float* g, float* beta) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Nv; ++h) {
      const int64_t i = t * Nv + h;
      beta[i] = float(sigmoid(b[i]));
      g[i] = float(double(A[h]) * softplus(double(a[i]) + double(dt_bias[h])));
    }
}

void gdn_recurrent(float* state, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv, float* out) {
  check_heads(Nk, Nv);
  const int64_t rep = Nv / Nk;
  std::vector<double> S(size_t(Dk * Dv)), kv(static_cast<size_t>(Dv)), delta(static_cast<size_t>(Dv));
  for (int64_t h = 0; h < Nv; ++h) {
    const int64_t kh = h / rep;
    float* Sh = state + h * Dk * Dv;
    for (int64_t i = 0; i < Dk * Dv; ++i) S[size_t(i)] = Sh[i];
    for (int64_t t = 0; t < T; ++t) {
      const float* qt = q + (t * Nk + kh) * Dk;
      const float* kt = k + (t * Nk + kh) * Dk;
      const float* vt = v + (t * Nv + h) * Dv;
      const double decay = std::exp(double(g[t * Nv + h])), bt = beta[t * Nv + h];
      for (auto& s : S) s *= decay;                                         // S = exp(g) S
      for (int64_t j = 0; j < Dv; ++j) {                                    // kv = S^T k
        double acc = 0.0;
        for (int64_t i = 0; i < Dk; ++i) acc += S[size_t(i * Dv + j)] * double(kt[i]);
        kv[size_t(j)] = acc;
      }
      for (int64_t j = 0; j < Dv; ++j) delta[size_t(j)] = bt * (double(vt[j]) - kv[size_t(j)]);
      for (int64_t i = 0; i < Dk; ++i)                                      // S += k delta^T
        for (int64_t j = 0; j < Dv; ++j) S[size_t(i * Dv + j)] += double(kt[i]) * delta[size_t(j)];
      for (int64_t j = 0; j < Dv; ++j) {                                    // o = S^T q
        double acc = 0.0;
        for (int64_t i = 0; i < Dk; ++i) acc += S[size_t(i * Dv + j)] * double(qt[i]);
        out[(t * Nv + h) * Dv + j] = float(acc);
      }
    }
    for (int64_t i = 0; i < Dk * Dv; ++i) Sh[i] = float(S[size_t(i)]);
  }
}

void gdn_chunked(float* state, const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv, float* out, int64_t chunk) {
  check_heads(Nk, Nv);
  if (chunk < 1) fail("gdn_chunked: chunk = {} must be >= 1", chunk);
  const int64_t rep = Nv / Nk;
  const int64_t C = chunk;
  std::vector<double> S(size_t(Dk * Dv)), Gam(static_cast<size_t>(C)), A(size_t(C * C)), Tm(size_t(C * C));
  std::vector<double> W(size_t(C * Dk)), U(size_t(C * Dv)), Vp(size_t(C * Dv));
  for (int64_t h = 0; h < Nv; ++h) {
    const int64_t kh = h / rep;
    float* Sh = state + h * Dk * Dv;
    for (int64_t i = 0; i < Dk * Dv; ++i) S[size_t(i)] = Sh[i];
    for (int64_t t0 = 0; t0 < T; t0 += C) {
      const int64_t L = std::min(C, T - t0);
      auto Q = [&](int64_t r, int64_t i) { return double(q[((t0 + r) * Nk + kh) * Dk + i]); };
      auto K = [&](int64_t r, int64_t i) { return double(k[((t0 + r) * Nk + kh) * Dk + i]); };
      auto V = [&](int64_t r, int64_t j) { return double(v[((t0 + r) * Nv + h) * Dv + j]); };
      auto B = [&](int64_t r) { return double(beta[(t0 + r) * Nv + h]); };
      auto kdot = [&](int64_t r, int64_t j, bool query) {
        double acc = 0.0;
        for (int64_t i = 0; i < Dk; ++i) acc += (query ? Q(r, i) : K(r, i)) * K(j, i);
        return acc;
      };
      // Gamma: inclusive running sum of the log decays inside the chunk.
      double run = 0.0;
      for (int64_t r = 0; r < L; ++r) Gam[size_t(r)] = (run += double(g[(t0 + r) * Nv + h]));
      // A (strictly lower): beta_r e^{Gamma_r - Gamma_j} k_r . k_j.
      for (int64_t r = 0; r < L; ++r)
        for (int64_t j = 0; j < L; ++j)
          A[size_t(r * C + j)] = j < r ? B(r) * std::exp(Gam[size_t(r)] - Gam[size_t(j)]) * kdot(r, j, false) : 0.0;
      // T = (I + A)^-1, unit lower triangular, by forward substitution row by row:
      // T[r] = e_r - sum_{j<r} A[r][j] T[j].
      for (int64_t r = 0; r < L; ++r)
        for (int64_t c = 0; c < L; ++c) {
          double acc = r == c ? 1.0 : 0.0;
          for (int64_t j = c; j < r; ++j) acc -= A[size_t(r * C + j)] * Tm[size_t(j * C + c)];
          Tm[size_t(r * C + c)] = c <= r ? acc : 0.0;
        }
      // W = T diag(beta e^Gamma) K, U = T diag(beta) V.
      for (int64_t r = 0; r < L; ++r) {
        for (int64_t i = 0; i < Dk; ++i) {
          double acc = 0.0;
          for (int64_t c = 0; c <= r; ++c) acc += Tm[size_t(r * C + c)] * B(c) * std::exp(Gam[size_t(c)]) * K(c, i);
          W[size_t(r * Dk + i)] = acc;
        }
        for (int64_t j = 0; j < Dv; ++j) {
          double acc = 0.0;
          for (int64_t c = 0; c <= r; ++c) acc += Tm[size_t(r * C + c)] * B(c) * V(c, j);
          U[size_t(r * Dv + j)] = acc;
        }
      }
      // V' = U - W S0 (the deltas of the chunk's tokens).
      for (int64_t r = 0; r < L; ++r)
        for (int64_t j = 0; j < Dv; ++j) {
          double acc = U[size_t(r * Dv + j)];
          for (int64_t i = 0; i < Dk; ++i) acc -= W[size_t(r * Dk + i)] * S[size_t(i * Dv + j)];
          Vp[size_t(r * Dv + j)] = acc;
        }
      // O = e^Gamma Q S0 + ((Q K^T) ⊙ decay, diagonal included) V'.
      for (int64_t r = 0; r < L; ++r) {
        std::vector<double> qk(size_t(r + 1));
        for (int64_t j = 0; j <= r; ++j)
          qk[size_t(j)] = kdot(r, j, true) * std::exp(Gam[size_t(r)] - Gam[size_t(j)]);
        const double er = std::exp(Gam[size_t(r)]);
        for (int64_t jv = 0; jv < Dv; ++jv) {
          double inter = 0.0;
          for (int64_t i = 0; i < Dk; ++i) inter += Q(r, i) * S[size_t(i * Dv + jv)];
          double intra = 0.0;
          for (int64_t j = 0; j <= r; ++j) intra += qk[size_t(j)] * Vp[size_t(j * Dv + jv)];
          out[((t0 + r) * Nv + h) * Dv + jv] = float(er * inter + intra);
        }
      }
      // S = e^{Gamma_L} S0 + (e^{Gamma_L - Gamma} K)^T V'.
      const double eL = std::exp(Gam[size_t(L - 1)]);
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) {
          double acc = eL * S[size_t(i * Dv + j)];
          for (int64_t r = 0; r < L; ++r)
            acc += std::exp(Gam[size_t(L - 1)] - Gam[size_t(r)]) * K(r, i) * Vp[size_t(r * Dv + j)];
          S[size_t(i * Dv + j)] = acc;
        }
    }
    for (int64_t i = 0; i < Dk * Dv; ++i) Sh[i] = float(S[size_t(i)]);
  }
}

}  // namespace bonsai::ref
