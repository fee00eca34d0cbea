// Reference blockwise Walsh-Hadamard rotation, in double.
#include <cmath>
#include <vector>

#include "backend/ref/ops.h"
#include "util/error.h"

namespace bonsai::ref {
namespace {

void check(int64_t K, int64_t block) {
  if (block <= 0 || (block & (block - 1)) != 0) fail("hadamard: block {} is not a power of two", block);
  if (K % block != 0) fail("hadamard: K = {} is not a multiple of block {}", K, block);
}

// Unnormalised Sylvester FWHT in place: y[r] = sum_c (-1)^popcount(r & c) x[c]. The butterfly at
// stride h combines the pairs that differ only in bit h, which is exactly the Kronecker factorisation
// H_n = H_2 (x) H_{n/2} in natural (Sylvester) order.
void fwht(double* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

void rotate(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block, bool sign_first) {
  check(K, block);
  const double norm = 1.0 / std::sqrt(double(block));
  std::vector<double> buf(static_cast<size_t>(block));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b0 = 0; b0 < K; b0 += block) {
      float* xb = x + r * K + b0;
      for (int64_t i = 0; i < block; ++i)
        buf[size_t(i)] = double(xb[i]) * (sign_first && signs ? double(signs[b0 + i]) : 1.0);
      fwht(buf.data(), block);
      for (int64_t i = 0; i < block; ++i)
        xb[i] = float(buf[size_t(i)] * norm * (!sign_first && signs ? double(signs[b0 + i]) : 1.0));
    }
}

}  // namespace

void hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  rotate(x, rows, K, signs, block, /*sign_first=*/true);
}

void hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  rotate(x, rows, K, signs, block, /*sign_first=*/false);
}

}  // namespace bonsai::ref
