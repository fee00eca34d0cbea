// Helpers for the CUDA backend tests: skip without a device, host <-> device buffers, poisoned outputs,
// random canonical ternary matrices (kept alive for the whole run: the backend finds its device copy
// by the matrix's address), and the error measure of the backend op tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "util/half.h"

#define BONSAI_REQUIRE_GPU()                                                              \
  do {                                                                                    \
    if (::bonsai::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: skipped";    \
  } while (0)

namespace bonsai::cudatest {

inline CudaBackend& gpu() {
  static CudaBackend be;
  return be;
}

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
inline std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
inline std::vector<int8_t> random_signs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int8_t> s(n);
  for (auto& x : s) x = (rng() & 1) ? 1 : -1;
  return s;
}

inline Buffer up(Backend& be, const std::vector<float>& v) {
  Buffer b(be, v.size());
  be.copy_from_host(v.data(), v.size(), b.data());
  return b;
}
// Raw bytes (int8 signs, int32 permutations) in a device buffer.
template <class T>
Buffer up_bytes(Backend& be, const std::vector<T>& v) {
  const size_t bytes = v.size() * sizeof(T), n = (bytes + 3) / 4;
  std::vector<float> raw(n, 0.f);
  std::memcpy(raw.data(), v.data(), bytes);
  return up(be, raw);
}
inline Buffer poisoned(Backend& be, size_t n) {
  return up(be, std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}
inline std::vector<float> down(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.copy_to_host(p, n, v.data());
  return v;
}
inline std::vector<float> down(Backend& be, const Buffer& b) { return down(be, b.data(), b.size()); }

// max |got - want| / max |want|; a non-finite got gives +inf (unwritten poisoned outputs fail).
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double scale = 0.0, err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    scale = std::max(scale, std::fabs(double(want[i])));
    err = std::max(err, std::fabs(double(got[i]) - double(want[i])));
  }
  return scale > 0 ? err / scale : err;
}

// A random canonical ternary matrix [N, K] (codes 0..2, code 3 with probability p3), scales in the range
// of the real packs. Stored in a process-lifetime pool so its address is never reused.
inline TernaryMatrix& random_matrix(int64_t N, int64_t K, uint32_t seed, double p3 = 0.0) {
  static std::deque<TernaryMatrix> pool;
  TernaryMatrix& t = pool.emplace_back();
  t.name = "test." + std::to_string(N) + "x" + std::to_string(K) + "." + std::to_string(seed);
  t.rows = N;
  t.cols = K;
  std::vector<uint32_t> words(size_t(N * K / 16), 0);  // split form, encoded into the canonical blocks below
  std::vector<uint16_t> scales(size_t(N * K / 128));
  std::mt19937_64 rng(seed);
  for (auto& w : words) {
    uint32_t v = 0;
    for (int j = 0; j < 16; ++j) {
      const uint64_t r = rng();
      uint32_t q = uint32_t(r % 3);
      if (p3 > 0 && double(r >> 40) / double(1ull << 24) < p3) q = 3;
      v |= q << (2 * j);
    }
    w = v;
  }
  std::uniform_real_distribution<float> sc(0.004f, 0.03f);
  for (auto& s : scales) s = f32_to_fp16(sc(rng));
  t.assign_split(words.data(), scales.data(), N, K);
  return t;
}

// The activation as the CUDA ternary kernels see it, per element: x quantised per 128-group the way the site kernel
// does it (d = amax / 127, v = x * (127 / amax), q0 = rint(v); q16 (levels 2) adds the second digit
// q1 = rint((v - q0) * 254), x ~= d (q0 + q1 / 254)); fp16: then as GEMM v4's xh_pack_kernel forms it from those
// digits, fp16(u * (254 q0 + q1)) with the unit u = d / 254 (q16) or fp16(d q0) (q8), in float arithmetic.
// row_units (Options::row_units): amax over the whole row instead of the 128-group.
inline std::vector<double> site_activation(const std::vector<float>& x, int64_t M, int64_t K, int levels, bool fp16,
                                           bool row_units = false) {
  std::vector<double> xv(size_t(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < K / 128; ++g) {
      float amax = 0.f;
      const int64_t s0 = row_units ? 0 : g * 128, s1 = row_units ? K : g * 128 + 128;
      for (int64_t i = s0; i < s1; ++i) amax = std::max(amax, std::fabs(x[size_t(m * K + i)]));
      const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      for (int64_t i = 0; i < 128; ++i) {
        const size_t e = size_t(m * K + g * 128 + i);
        const float v = x[e] * inv;
        const float q0 = std::max(-127.f, std::min(127.f, std::nearbyint(v)));
        const float q1 = levels == 2 ? std::max(-127.f, std::min(127.f, std::nearbyint((v - q0) * 254.f))) : 0.f;
        if (fp16)
          xv[e] = fp16_to_f32(f32_to_fp16(levels == 2 ? (d / 254.f) * (254.f * q0 + q1) : d * q0));
        else
          xv[e] = double(d) * (double(q0) + double(q1) / 254.0);
      }
    }
  return xv;
}

// y [M, N] = the product with the exact weights (code - 1) d_w over the activation `xv` (site_activation), summed in
// double. The rows are independent, so they are split over the host's threads (this reference took most of the wall
// time of the big-shape GPU tests, and the device machine's time is the scarce one); each y is the same serial sum
// whoever computes it.
inline std::vector<float> ternary_reference(const TernaryMatrix& w, const std::vector<double>& xv, int64_t M) {
  const int64_t K = w.cols, N = w.rows, G = K / 128;
  std::vector<float> y(size_t(M * N));
  auto rows = [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) {
        double acc = 0;
        for (int64_t g = 0; g < G; ++g) {
          double s = 0;
          for (int64_t i = 0; i < 128; ++i) {
            const int64_t e = g * 128 + i;
            s += double(w.code(n, e) - 1) * xv[size_t(m * K + e)];
          }
          acc += s * double(fp16_to_f32(w.group_scale(n, g)));
        }
        y[size_t(m * N + n)] = float(acc);
      }
  };
  const int64_t nt = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), std::max<int64_t>(1, N / 64));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < nt; ++t) pool.emplace_back(rows, N * t / nt, N * (t + 1) / nt);
  rows(0, N / nt);
  for (std::thread& th : pool) th.join();
  return y;
}

// The exact result of the int8 ternary kernels' arithmetic (q16 / q8 digits, exact integer dots).
inline std::vector<float> quantised_reference(const TernaryMatrix& w, const std::vector<float>& x, int64_t M,
                                              int levels = 2, bool row_units = false) {
  return ternary_reference(w, site_activation(x, M, w.cols, levels, false, row_units), M);
}
// What GEMM v4 (Options::gemm_f16) computes: the same digits in fp16 times the exact weights.
inline std::vector<float> f16_reference(const TernaryMatrix& w, const std::vector<float>& x, int64_t M, int levels = 2,
                                        bool row_units = false) {
  return ternary_reference(w, site_activation(x, M, w.cols, levels, true, row_units), M);
}

// One form of the fused batch-1 FFN (CudaBackend::Options::ffn_*), as the FFN tests and the kernel bench sweep them:
// stage rows, ffn_down's copy form, the balance mode, the barrier's release arrival and the kernel's own sum of the
// partials (round 37).
struct FfnForm {
  int rows = 32, copy = 2, balance = 0;
  bool release = false, reduce = false;
  CudaBackend::Options on(CudaBackend::Options o) const {
    o.ffn_rows = rows;
    o.ffn_b_copy = copy;
    o.ffn_balance = balance;
    o.ffn_release = release;
    o.ffn_reduce = reduce;
    return o;
  }
};

}  // namespace bonsai::cudatest
