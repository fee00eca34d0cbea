// Sampler: the next token from a row of logits.
//
// Order (HF generate's): repetition penalty -> temperature -> top-k -> top-p -> min-p -> draw.
// - temperature <= 0 is greedy: the argmax after the penalty, the LOWEST index winning ties. top_k = 1 is
//   the same token at any temperature (candidates are ordered by logit, then by index).
// - repetition penalty (HF / CTRL): for each distinct token among the last repeat_last_n of `history`,
//   logit > 0 -> logit / penalty, else logit * penalty.
// - top_p keeps the smallest prefix (by probability, descending) whose mass reaches top_p; min_p keeps
//   tokens with p >= min_p * p_max. Both always keep the most likely token.
// - The draw uses our own xoshiro256** seeded from `seed` (splitmix64), and no std:: distribution, so
//   a seed gives the same tokens on every platform and build.
// No allocation per call (buffers sized to the vocabulary at construction).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace bonsai {

struct SamplerOptions {
  float temperature = 0.0f;     // <= 0: greedy
  int32_t top_k = 0;            // <= 0: off
  float top_p = 1.0f;           // >= 1: off
  float min_p = 0.0f;           // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off; > 1 discourages repeats
  int32_t repeat_last_n = 64;   // history window of the penalty; < 0: the whole history
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws bonsai::Error on invalid options (negative temperature is allowed and means greedy;
  // top_p / min_p outside [0, 1], penalty <= 0).
  Sampler(const SamplerOptions& opt, int64_t vocab);
  const SamplerOptions& options() const { return opt_; }
  bool greedy() const { return opt_.temperature <= 0.0f; }
  // sample() is then the argmax of the logits as given (greedy or top-k 1, and no penalty) and draws
  // nothing from the random stream: a caller may ask the decoder for the argmax instead (no logits copy).
  bool plain_argmax() const { return (greedy() || opt_.top_k == 1) && opt_.repeat_penalty == 1.0f; }

  // logits fp32 [vocab]; history: the tokens so far (prompt and generated), for the penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history = {});

  // The top-k route (a backend picks the candidates, Backend::top_k, and only they cross to the host):
  // how many candidates sample() looks at when that is fewer than the whole row: 1 for greedy / top-k 1
  // (with a penalty; without one plain_argmax() is cheaper), top_k when >= 2, else 0 (top-k off: sample()
  // needs every logit).
  int32_t top_k_wanted() const;
  // The distinct tokens of history's penalty window in [0, vocab), first seen first; empty when the penalty
  // is off. For Backend::top_k, which applies the penalty itself.
  void penalized_tokens(std::span<const int32_t> history, std::vector<int32_t>& out);
  // sample() over the row's top_k_wanted() best candidates as it orders them (value descending, then index
  // ascending, NaN dropped, the penalty applied): ids, values [top_k_wanted()], from a row with MORE non-NaN
  // values than that (or at least one, for greedy). Returns the same token as sample() on the whole row
  // and takes the same draws from the random stream.
  int32_t sample_top_k(std::span<const int32_t> ids, std::span<const float> values);

  // Restarts the random stream from `seed`.
  void reseed(uint64_t seed);

 private:
  uint64_t next_u64();
  double next_unit();  // uniform in [0, 1)
  // sample()'s tail over cand_[0 .. keep), ordered (in full when top-p is on): softmax with temperature,
  // top-p, min-p, the draw. value_of(i) = the (penalised) logit of cand_[i].
  template <class ValueOf>
  int32_t draw(int64_t keep, ValueOf value_of);

  SamplerOptions opt_;
  int64_t vocab_;
  std::vector<float> work_;       // [vocab] penalised logits
  std::vector<int32_t> cand_;     // [vocab] candidate ids, best first
  std::vector<double> prob_;      // [vocab] candidate probabilities
  std::vector<uint32_t> stamp_;   // [vocab] marks tokens already penalised in this call
  std::vector<int32_t> penalized_;  // sample()'s penalised tokens (penalized_tokens)
  uint32_t stamp_gen_ = 0;
  uint64_t rng_[4] = {};
};

// Index of the largest logit, lowest index on ties; NaNs never win (all-NaN gives 0).
int32_t greedy_argmax(std::span<const float> logits);

}  // namespace bonsai
