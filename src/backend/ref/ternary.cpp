// Reference ternary, bf16 and fp32 linear layers: dequantise each weight exactly, accumulate in double.
#include <vector>

#include "backend/ref/ops.h"
#include "util/error.h"
#include "util/half.h"

namespace bonsai::ref {
namespace {

void check_k(int64_t K) {
  if (K <= 0 || K % 128 != 0) fail("ternary_matmul: K = {} is not a positive multiple of 128", K);
}

// W[row][:] as doubles: (code - 1) * d, code 3 -> +2d.
void dequant_row(const uint32_t* words, const uint16_t* scales, int64_t K, int64_t row, double* out) {
  const uint32_t* w = words + row * (K / 16);
  const uint16_t* s = scales + row * (K / 128);
  for (int64_t e = 0; e < K; ++e) {
    const int code = int((w[e / 16] >> (2 * (e % 16))) & 3u);
    out[e] = double(code - 1) * double(fp16_to_f32(s[e / 128]));
  }
}

}  // namespace

void ternary_matmul(const uint32_t* words, const uint16_t* scales, int64_t N, int64_t K, const float* x,
                    int64_t M, float* y) {
  check_k(K);
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    dequant_row(words, scales, K, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0.0;
      for (int64_t e = 0; e < K; ++e) acc += w[size_t(e)] * double(x[m * K + e]);
      y[m * N + n] = float(acc);
    }
  }
}

void ternary_matmul_multi(const TernaryOut* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  for (int i = 0; i < n_outs; ++i) ternary_matmul(outs[i].words, outs[i].scales, outs[i].N, K, x, M, outs[i].y);
}

void ternary_dequant_row(const uint32_t* words, const uint16_t* scales, int64_t K, int64_t row, float* out) {
  check_k(K);
  std::vector<double> w(static_cast<size_t>(K));
  dequant_row(words, scales, K, row, w.data());
  for (int64_t e = 0; e < K; ++e) out[e] = float(w[size_t(e)]);
}

void dense_matmul_bf16(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t e = 0; e < K; ++e) acc += double(bf16_to_f32(w[n * K + e])) * double(x[m * K + e]);
      y[m * N + n] = float(acc);
    }
}

void dense_matmul_f32(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t e = 0; e < K; ++e) acc += double(w[n * K + e]) * double(x[m * K + e]);
      y[m * N + n] = float(acc);
    }
}

}  // namespace bonsai::ref
