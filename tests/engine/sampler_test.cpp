// Sampler: greedy ties, top-k = 1 is greedy, seed determinism, the truncations, the penalty, and that a
// plain temperature draw follows the softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "util/error.h"
#include "sampler_cases.h"

using namespace bonsai;

namespace {

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST(Sampler, GreedyTiesGoToTheLowestIndex) {
  std::vector<float> l{0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  Sampler s({}, int64_t(l.size()));
  EXPECT_TRUE(s.greedy());
  EXPECT_EQ(s.sample(l), 1);
  EXPECT_EQ(greedy_argmax(l), 1);
  l[0] = NAN;  // NaN never wins
  EXPECT_EQ(s.sample(l), 1);
  const std::vector<float> all_nan(3, NAN);
  EXPECT_EQ(greedy_argmax(all_nan), 0);
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperature) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(1000, seed);
    l[997] = l[size_t(greedy_argmax(l))];  // a tie at the top: the lower index must win
    SamplerOptions o;
    o.temperature = 1.5f;
    o.top_k = 1;
    o.seed = seed;
    Sampler s(o, 1000);
    EXPECT_EQ(s.sample(l), greedy_argmax(l));
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_p = 0.95f;
  o.top_k = 40;
  o.min_p = 0.01f;
  o.repeat_penalty = 1.1f;
  auto run = [&](uint64_t seed) {
    o.seed = seed;
    Sampler s(o, 500);
    std::vector<int32_t> out;
    for (uint32_t i = 0; i < 64; ++i) out.push_back(s.sample(random_logits(500, 100 + i, 1.0f), out));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  // reseed restarts the stream.
  o.seed = 7;
  Sampler s(o, 500);
  const auto l = random_logits(500, 5, 1.0f);
  std::vector<int32_t> a, b;
  for (int i = 0; i < 16; ++i) a.push_back(s.sample(l));
  s.reseed(7);
  for (int i = 0; i < 16; ++i) b.push_back(s.sample(l));
  EXPECT_EQ(a, b);
}

TEST(Sampler, TruncationsKeepOnlyTheirSet) {
  // p = softmax([4, 3, 2, 1, 0, ...]): top-k 3 keeps ids 0..2; top-p 0.8 keeps ids 0, 1 (0.632 + 0.233 =
  // 0.865 >= 0.8); min-p 0.3 keeps ids with p >= 0.3 p_max: 0 and 1 (e^-1 = 0.37), not 2 (e^-2 = 0.14).
  std::vector<float> l{4, 3, 2, 1, 0, -1, -2, -3};
  auto drawn = [&](SamplerOptions o) {
    o.temperature = 1.0f;
    Sampler s(o, int64_t(l.size()));
    std::set<int32_t> seen;
    for (int i = 0; i < 3000; ++i) seen.insert(s.sample(l));
    return seen;
  };
  SamplerOptions k;
  k.top_k = 3;
  EXPECT_EQ(drawn(k), (std::set<int32_t>{0, 1, 2}));
  SamplerOptions p;
  p.top_p = 0.8f;
  EXPECT_EQ(drawn(p), (std::set<int32_t>{0, 1}));
  SamplerOptions m;
  m.min_p = 0.3f;
  EXPECT_EQ(drawn(m), (std::set<int32_t>{0, 1}));
  SamplerOptions none;
  EXPECT_EQ(drawn(none).size(), l.size());
}

TEST(Sampler, TemperatureDrawFollowsTheSoftmax) {
  const std::vector<float> l{1.0f, 0.0f, 2.0f, -1.0f};
  SamplerOptions o;
  o.temperature = 2.0f;
  o.seed = 3;
  Sampler s(o, 4);
  std::map<int32_t, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[s.sample(l)];
  double z = 0;
  for (float x : l) z += std::exp(double(x) / 2.0);
  for (int32_t t = 0; t < 4; ++t) {
    const double p = std::exp(double(l[size_t(t)]) / 2.0) / z, got = double(count[t]) / n;
    EXPECT_NEAR(got, p, 5 * std::sqrt(p * (1 - p) / n)) << "token " << t;  // 5 sigma
  }
}

TEST(Sampler, RepetitionPenalty) {
  std::vector<float> l{2.0f, 1.9f, -1.0f, -1.1f};
  SamplerOptions o;
  o.repeat_penalty = 1.5f;
  Sampler s(o, 4);
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{}), 0);
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0}), 1);        // 2 / 1.5 < 1.9
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0, 0, 0}), 1);  // penalised once per distinct token
  std::vector<float> neg{-1.0f, -1.2f};
  Sampler s2(o, 2);
  EXPECT_EQ(s2.sample(neg, std::vector<int32_t>{0}), 1);  // -1 * 1.5 < -1.2
  // Window: only the last repeat_last_n tokens count.
  o.repeat_last_n = 1;
  Sampler s3(o, 4);
  EXPECT_EQ(s3.sample(l, std::vector<int32_t>{0, 2}), 0);
}

TEST(Sampler, RejectsBadOptions) {
  SamplerOptions o;
  o.top_p = 1.5f;
  EXPECT_THROW(Sampler(o, 10), Error);
  o = {};
  o.min_p = -0.1f;
  EXPECT_THROW(Sampler(o, 10), Error);
  o = {};
  o.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler(o, 10), Error);
  Sampler s({}, 10);
  EXPECT_THROW(s.sample(std::vector<float>(9, 0.0f)), Error);
}

// The top-k route (Session::next_token): a backend's top-k candidates (HostBackend::top_k, the reference
// for the CUDA kernel) given to sample_top_k pick the same tokens as sample() on the whole row, draw for
// draw, on rows with ties (values on a 1/8 grid) and NaNs, with the penalty over a history window.
TEST(Sampler, TopKCandidatesPickWhatTheWholeRowPicks) {
  constexpr int64_t V = 600;
  CpuBackend be;
  std::mt19937 rng(3);
  std::vector<int32_t> history(40);
  for (auto& t : history) t = int32_t(rng() % 120);  // repeats: the window's distinct tokens matter
  auto opts = [](float temp, int32_t top_k, float top_p, float min_p, float penalty) {
    return testing_support::sampler_options(temp, top_k, top_p, min_p, penalty, 24, 7);
  };
  for (const SamplerOptions& o : {opts(0, 0, 1, 0, 1.5f), opts(0.7f, 1, 1, 0, 1.3f), opts(1, 2, 1, 0, 1),
                                  opts(1.3f, 20, 0.8f, 0, 1.1f), opts(0.9f, 64, 1, 0.02f, 1.4f), opts(2, 590, 0.97f, 0, 1)}) {
    Sampler whole(o, V), top(o, V);
    const int32_t k = top.top_k_wanted();
    ASSERT_GE(k, 1);
    std::vector<int32_t> ids(static_cast<size_t>(k)), pen;
    std::vector<float> vals(static_cast<size_t>(k));
    int draws = 0;
    for (int row = 0; row < 200; ++row) {
      std::vector<float> logits(V);
      for (auto& v : logits) v = float(int(rng() % 64) - 40) / 8.0f;  // many exact ties
      for (int j = 0; j < 3; ++j) logits[rng() % V] = NAN;
      std::vector<float> x = logits;
      top.penalized_tokens(history, pen);
      const int64_t count = be.top_k(x.data(), V, k, o.repeat_penalty, pen.data(), int64_t(pen.size()), ids.data(), vals.data());
      ASSERT_GT(count, k - 1) << "row " << row;
      if (k >= 2) {
        ASSERT_GT(count, k);
      }
      for (int32_t i = 1; i < k; ++i)  // value descending, then index ascending
        ASSERT_TRUE(vals[size_t(i - 1)] > vals[size_t(i)] || (vals[size_t(i - 1)] == vals[size_t(i)] && ids[size_t(i - 1)] < ids[size_t(i)]));
      ASSERT_EQ(whole.sample(logits, history), top.sample_top_k(ids, vals)) << "top_k " << o.top_k << " row " << row;
      ++draws;
    }
    EXPECT_EQ(draws, 200);
  }
  // The wrong number of candidates is an error, not a silent pick.
  Sampler s(opts(1, 8, 1, 0, 1), V);
  EXPECT_THROW(s.sample_top_k(std::vector<int32_t>(3), std::vector<float>(3)), Error);
  EXPECT_EQ(Sampler(opts(1, 0, 1, 0, 1), V).top_k_wanted(), 0);  // top-k off: the whole row is needed
}
