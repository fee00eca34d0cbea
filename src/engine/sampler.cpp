#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "util/error.h"

namespace bonsai {

int32_t greedy_argmax(std::span<const float> logits) {
  int32_t best = 0;
  float bv = -INFINITY;
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    if (!found || v > bv) {
      best = int32_t(i);
      bv = v;
      found = true;
    }
  }
  return best;
}

Sampler::Sampler(const SamplerOptions& opt, int64_t vocab) : opt_(opt), vocab_(vocab) {
  if (vocab < 1) fail("sampler: vocabulary of {} tokens", vocab);
  if (!(opt.top_p >= 0.0f && opt.top_p <= 1.0f)) fail("--top-p must be in [0, 1], got {}", opt.top_p);
  if (!(opt.min_p >= 0.0f && opt.min_p <= 1.0f)) fail("--min-p must be in [0, 1], got {}", opt.min_p);
  if (!(opt.repeat_penalty > 0.0f)) fail("--repeat-penalty must be > 0, got {}", opt.repeat_penalty);
  if (std::isnan(opt.temperature)) fail("--temp must be a number");
  work_.resize(size_t(vocab));
  cand_.resize(size_t(vocab));
  prob_.resize(size_t(vocab));
  stamp_.assign(size_t(vocab), 0);
  reseed(opt.seed);
}

void Sampler::reseed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : rng_) {  // splitmix64
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s = z ^ (z >> 31);
  }
}

uint64_t Sampler::next_u64() {  // xoshiro256**
  auto rotl = [](uint64_t v, int k) { return (v << k) | (v >> (64 - k)); };
  const uint64_t r = rotl(rng_[1] * 5, 7) * 9, t = rng_[1] << 17;
  rng_[2] ^= rng_[0];
  rng_[3] ^= rng_[1];
  rng_[1] ^= rng_[2];
  rng_[0] ^= rng_[3];
  rng_[2] ^= t;
  rng_[3] = rotl(rng_[3], 45);
  return r;
}

double Sampler::next_unit() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

template <class ValueOf>
int32_t Sampler::draw(int64_t keep, ValueOf value_of) {
  const bool need_order = opt_.top_p < 1.0f;
  // Softmax with temperature over the kept candidates (double).
  const double inv_t = 1.0 / double(opt_.temperature), top = double(value_of(0)) * inv_t;
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) sum += (prob_[size_t(i)] = std::exp(double(value_of(i)) * inv_t - top));
  for (int64_t i = 0; i < keep; ++i) prob_[size_t(i)] /= sum;

  if (need_order) {  // smallest prefix with mass >= top_p
    double cum = 0.0;
    int64_t k = 0;
    while (k < keep) {
      cum += prob_[size_t(k++)];
      if (cum >= double(opt_.top_p)) break;
    }
    keep = std::max<int64_t>(1, k);
  }
  double total = 0.0;
  if (opt_.min_p > 0.0f) {  // drop p < min_p * p_max (p_max = prob_[0]); compacts the kept set
    const double floor_p = double(opt_.min_p) * prob_[0];
    int64_t k = 0;
    for (int64_t i = 0; i < keep; ++i)
      if (i == 0 || prob_[size_t(i)] >= floor_p) {
        cand_[size_t(k)] = cand_[size_t(i)];
        prob_[size_t(k)] = prob_[size_t(i)];
        ++k;
      }
    keep = k;
  }
  for (int64_t i = 0; i < keep; ++i) total += prob_[size_t(i)];

  double u = next_unit() * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= prob_[size_t(i)];
    if (u < 0.0) return cand_[size_t(i)];
  }
  return cand_[size_t(keep - 1)];
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (int64_t(logits.size()) != vocab_) fail("sampler: {} logits for a vocabulary of {}", logits.size(), vocab_);
  std::span<const float> l = logits;
  // Repetition penalty on a copy, once per distinct token of the window.
  if (opt_.repeat_penalty != 1.0f && !history.empty()) {
    std::copy(logits.begin(), logits.end(), work_.begin());
    penalized_tokens(history, penalized_);
    for (const int32_t t : penalized_) work_[size_t(t)] = repetition_penalised(work_[size_t(t)], opt_.repeat_penalty);
    l = work_;
  }
  if (greedy() || opt_.top_k == 1) return greedy_argmax(l);

  // Candidates ordered by logit (descending), then index (ascending): deterministic and tie-stable.
  // NaN logits are dropped.
  int64_t n = 0;
  for (int64_t i = 0; i < vocab_; ++i)
    if (!std::isnan(l[size_t(i)])) cand_[size_t(n++)] = int32_t(i);
  if (n == 0) return 0;
  auto better = [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); };
  const bool need_order = opt_.top_p < 1.0f;
  int64_t keep = n;
  if (opt_.top_k > 0 && opt_.top_k < n) {
    keep = opt_.top_k;
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.begin() + n, better);
  } else if (need_order) {
    std::sort(cand_.begin(), cand_.begin() + n, better);
  } else {
    // Only the best is needed in front (the reference for softmax and min-p).
    std::iter_swap(cand_.begin(), std::min_element(cand_.begin(), cand_.begin() + n, better));
  }

  return draw(keep, [&](int64_t i) { return l[size_t(cand_[size_t(i)])]; });
}

int32_t Sampler::top_k_wanted() const {
  if (greedy() || opt_.top_k == 1) return 1;
  return opt_.top_k >= 2 ? opt_.top_k : 0;
}

void Sampler::penalized_tokens(std::span<const int32_t> history, std::vector<int32_t>& out) {
  out.clear();
  if (opt_.repeat_penalty == 1.0f || history.empty()) return;
  if (++stamp_gen_ == 0) {
    std::fill(stamp_.begin(), stamp_.end(), 0u);
    stamp_gen_ = 1;
  }
  const size_t n = history.size();
  const size_t from = opt_.repeat_last_n < 0 ? 0 : n - std::min(n, size_t(opt_.repeat_last_n));
  for (size_t i = from; i < n; ++i) {
    const int32_t t = history[i];
    if (t < 0 || t >= vocab_ || stamp_[size_t(t)] == stamp_gen_) continue;
    stamp_[size_t(t)] = stamp_gen_;
    out.push_back(t);
  }
}

int32_t Sampler::sample_top_k(std::span<const int32_t> ids, std::span<const float> values) {
  const int32_t k = top_k_wanted();
  if (k < 1 || ids.size() != size_t(k) || values.size() != size_t(k))
    fail("sampler: {} top-k candidates given, {} wanted", ids.size(), k);
  if (k == 1) return ids[0];  // greedy: no draw
  std::copy(ids.begin(), ids.end(), cand_.begin());
  return draw(k, [&](int64_t i) { return values[size_t(i)]; });
}

}  // namespace bonsai
