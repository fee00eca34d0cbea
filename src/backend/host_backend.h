// HostBackend: the memory half of the Backend interface for backends whose buffers are ordinary host
// memory (ref, cpu): 64-byte aligned allocations and plain loops for copies. The ops half is left to
// the subclass.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "backend/backend.h"

namespace bonsai {

class HostBackend : public Backend {
 public:
  float* allocate(size_t n) override {
    auto* p = static_cast<float*>(::operator new[](std::max<size_t>(n, 1) * sizeof(float), std::align_val_t(64)));
    std::memset(p, 0, n * sizeof(float));
    return p;
  }
  void release(float* p) noexcept override { ::operator delete[](p, std::align_val_t(64)); }
  void zero(float* x, size_t n) override { std::memset(x, 0, n * sizeof(float)); }
  void copy_to_host(const float* src, size_t n, float* host) override {
    if (src != host) std::memcpy(host, src, n * sizeof(float));
  }
  void copy_from_host(const float* host, size_t n, float* dst) override {
    if (host != dst) std::memcpy(dst, host, n * sizeof(float));
  }
  void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, size_t(cols) * sizeof(float));
  }
  void scale(float* x, size_t n, float s) override {
    for (size_t i = 0; i < n; ++i) x[i] *= s;
  }
  void permute_cols(const float* x, int64_t rows, int64_t K, const int32_t* perm, float* out) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < K; ++i) out[r * K + i] = x[r * K + perm[i]];
  }
  // The host form of the top-k pick (the reference the CUDA kernel is tested against): the sampler's own
  // order (partial sort, value descending then index ascending), no copy of the row.
  int64_t top_k(float* x, int64_t n, int32_t k, float penalty, const int32_t* penalized, int64_t n_penalized,
                int32_t* ids, float* values) override {
    if (k < 1) return -1;
    for (int64_t i = 0; i < n_penalized; ++i) x[penalized[i]] = repetition_penalised(x[penalized[i]], penalty);
    order_.clear();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isnan(x[i])) order_.push_back(int32_t(i));
    const int64_t count = int64_t(order_.size()), m = std::min<int64_t>(k, count);
    std::partial_sort(order_.begin(), order_.begin() + m, order_.end(),
                      [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int64_t i = 0; i < m; ++i) {
      ids[i] = order_[size_t(i)];
      values[i] = x[order_[size_t(i)]];
    }
    return count;
  }

 private:
  std::vector<int32_t> order_;  // [n] top_k's candidate ids
};

}  // namespace bonsai
