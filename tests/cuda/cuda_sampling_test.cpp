// Sampling's top-k pick on the device (CudaBackend::top_k, sampling.cu) against the host form
// (HostBackend::top_k, which the engine tests hold to Sampler::sample): the same count, ids and values,
// bit for bit, on rows with exact ties, NaNs, signed zeros, infinities and a penalty list, at the 27B
// vocabulary and at odd small sizes, k from 1 to 1024 and past the row's non-NaN count.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cuda_test_util.h"

using namespace bonsai;
using namespace bonsai::cudatest;

namespace {

// n logits on a 1/16 grid (ties everywhere), a few NaN, both zeros and both infinities when n allows.
std::vector<float> tricky_row(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(int(rng() % 512) - 300) / 16.0f;
  if (n > 40) {
    for (int j = 0; j < 7; ++j) v[rng() % n] = NAN;
    v[rng() % n] = 0.0f;
    v[rng() % n] = -0.0f;
    v[rng() % n] = INFINITY;
    v[rng() % n] = -INFINITY;
  }
  return v;
}

}  // namespace

TEST(CudaSampling, TopKMatchesTheHostPick) {
  BONSAI_REQUIRE_GPU();
  CudaBackend& be = gpu();
  CpuBackend host;
  struct Case {
    int64_t n;
    int32_t k;
    float penalty;
    int n_pen;
  };
  const std::vector<Case> cases{{248320, 1, 1.0f, 0},  {248320, 20, 1.3f, 64}, {248320, 1024, 1.1f, 256},
                                {248320, 2, 0.8f, 5},   {1000, 40, 1.2f, 17},   {1000, 1024, 1.0f, 0},
                                {37, 8, 1.5f, 3},       {5, 20, 1.0f, 0},       {3000, 300, 1.4f, 100}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    std::vector<float> row = tricky_row(c.n, seed++);
    if (c.n == 5) row = {1.0f, NAN, -2.0f, NAN, 1.0f};  // 3 non-NaN for k = 20
    std::mt19937 rng(seed);
    std::vector<int32_t> pen;
    std::vector<char> used(static_cast<size_t>(c.n), 0);
    while (int(pen.size()) < c.n_pen) {
      const int32_t t = int32_t(rng() % uint32_t(c.n));
      if (!used[size_t(t)]) used[size_t(t)] = 1, pen.push_back(t);
    }
    const std::string what = "n " + std::to_string(c.n) + " k " + std::to_string(c.k);
    std::vector<float> hx = row;
    std::vector<int32_t> want_ids(static_cast<size_t>(c.k), -1), got_ids(static_cast<size_t>(c.k), -1);
    std::vector<float> want_v(static_cast<size_t>(c.k), 0.0f), got_v(static_cast<size_t>(c.k), 0.0f);
    const int64_t want = host.top_k(hx.data(), c.n, c.k, c.penalty, pen.data(), int64_t(pen.size()), want_ids.data(),
                                    want_v.data());
    Buffer dx = up(be, row);
    const int64_t got = be.top_k(dx.data(), c.n, c.k, c.penalty, pen.data(), int64_t(pen.size()), got_ids.data(),
                                 got_v.data());
    ASSERT_EQ(got, want) << what;
    const int64_t m = std::min<int64_t>(c.k, want);
    for (int64_t i = 0; i < m; ++i) {
      ASSERT_EQ(got_ids[size_t(i)], want_ids[size_t(i)]) << what << " rank " << i;
      ASSERT_EQ(std::memcmp(&got_v[size_t(i)], &want_v[size_t(i)], 4), 0) << what << " rank " << i;
    }
    // The penalty was applied in place on the device, as on the host.
    const std::vector<float> dx_after = down(be, dx);
    for (int32_t t : pen)
      if (!std::isnan(hx[size_t(t)])) ASSERT_EQ(dx_after[size_t(t)], hx[size_t(t)]) << what << " token " << t;
  }
  // Past the kernel's limits: -1 and the row untouched.
  std::vector<float> row = tricky_row(100, 9);
  Buffer dx = up(be, row);
  std::vector<int32_t> ids(2000);
  std::vector<float> v(2000);
  EXPECT_EQ(be.top_k(dx.data(), 100, 1025, 1.0f, nullptr, 0, ids.data(), v.data()), -1);
  std::vector<int32_t> many(300);
  for (int i = 0; i < 300; ++i) many[size_t(i)] = i % 100;  // refused for its length alone
  EXPECT_EQ(be.top_k(dx.data(), 100, 4, 1.5f, many.data(), 300, ids.data(), v.data()), -1);
  const std::vector<float> after = down(be, dx);
  EXPECT_EQ(std::memcmp(after.data(), row.data(), row.size() * 4), 0);
}
