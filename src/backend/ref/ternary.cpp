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
  for (int64_t g = 0; g < K / 128; ++g) {  // one fp16 scale per 128 elements, 16 codes per word
    const double d = double(fp16_to_f32(s[g]));
    for (int64_t i = 0; i < 8; ++i) {
      uint32_t word = w[g * 8 + i];
      for (int64_t j = 0; j < 16; ++j, word >>= 2) out[g * 128 + i * 16 + j] = double(int(word & 3u) - 1) * d;
    }
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
      // Four interleaved double partial sums (K % 128 == 0): the same fp64 accuracy as one chain, four
      // times the throughput, which keeps whole-model reference runs of a few hundred tokens practical.
      const float* xm = x + m * K;
      double acc[4] = {0.0, 0.0, 0.0, 0.0};
      for (int64_t e = 0; e < K; e += 4)
        for (int64_t j = 0; j < 4; ++j) acc[j] += w[size_t(e + j)] * double(xm[e + j]);
      y[m * N + n] = float((acc[0] + acc[1]) + (acc[2] + acc[3]));
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
