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

// One stored row (blocks [K/128, 34]) as doubles: (code - 1) * d, code 3 -> +2d.
void dequant_row(const uint8_t* row, int64_t K, double* out) {
  for (int64_t g = 0; g < K / 128; ++g) {  // one block per 128 elements: fp16 d, then 4 codes per byte
    const uint8_t* blk = row + g * kPq2Bytes;
    const double d = double(fp16_to_f32(pq2_block_scale(blk)));
    for (int e = 0; e < 128; ++e) out[g * 128 + e] = double(pq2_block_code(blk, e) - 1) * d;
  }
}

void matmul(const TernaryOut& o, int64_t K, const float* x, int64_t M) {
  check_k(K);
  const int64_t N = o.N;
  const uint64_t row_bytes = uint64_t(K / 128) * kPq2Bytes;
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    dequant_row(o.blocks + uint64_t(stored_row(o.runs, o.n_runs, n)) * row_bytes, K, w.data());
    for (int64_t m = 0; m < M; ++m) {
      // Four interleaved double partial sums (K % 128 == 0): the same fp64 accuracy as one chain, four
      // times the throughput, which keeps whole-model reference runs of a few hundred tokens practical.
      const float* xm = x + m * K;
      double acc[4] = {0.0, 0.0, 0.0, 0.0};
      for (int64_t e = 0; e < K; e += 4)
        for (int64_t j = 0; j < 4; ++j) acc[j] += w[size_t(e + j)] * double(xm[e + j]);
      o.y[m * N + n] = float((acc[0] + acc[1]) + (acc[2] + acc[3]));
    }
  }
}

}  // namespace

void ternary_matmul(const uint8_t* blocks, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  matmul(TernaryOut{blocks, N, y}, K, x, M);
}

void ternary_matmul_multi(const TernaryOut* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  for (int i = 0; i < n_outs; ++i) matmul(outs[i], K, x, M);
}

void ternary_dequant_row(const uint8_t* blocks, int64_t K, int64_t row, float* out) {
  check_k(K);
  std::vector<double> w(static_cast<size_t>(K));
  dequant_row(blocks + uint64_t(row) * uint64_t(K / 128) * kPq2Bytes, K, w.data());
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
