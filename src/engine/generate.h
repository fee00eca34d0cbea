// One-shot generation on a Session: prefill the prompt, then sample up to max_new_tokens, stopping on a
// stop id, with the accounting a run prints (DESIGN.md "performance accounting is code").
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "engine/session.h"

namespace bonsai {

struct GenerateOptions {
  int64_t max_new_tokens = 16;    // -n
  SamplerOptions sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these (it is kept in the output)
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated = 0;          // tokens sampled (the first comes from the prefill's logits)
  int64_t decode_steps = 0;       // forwards of one generated token
  double prefill_seconds = 0;     // the whole prompt (every chunk + walked token) and the first sample
  double decode_seconds = 0;      // the decode steps, sampling included
  uint64_t weight_bytes_per_step = 0;  // Model::decode_weight_bytes()
  uint64_t state_bytes = 0;       // KV / conv / recurrent bytes moved over all decode steps

  double prefill_tok_s() const { return prefill_seconds > 0 ? double(prompt_tokens) / prefill_seconds : 0; }
  double decode_tok_s() const { return decode_seconds > 0 ? double(decode_steps) / decode_seconds : 0; }
  double ms_per_token() const { return decode_steps > 0 ? 1e3 * decode_seconds / double(decode_steps) : 0; }
  // (weights + state bytes touched) per decode step * decode steps per second.
  double decode_gb_s() const {
    return decode_seconds > 0 ? (double(weight_bytes_per_step) * double(decode_steps) + double(state_bytes)) /
                                    decode_seconds / 1e9
                              : 0;
  }
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (a stop id, when hit, is the last)
  bool stopped = false;         // ended on a stop id
  GenerateStats stats;
};

// Appends `prompt` to the session and generates. Checks every limit before anything runs (bonsai::Error):
// ids in the vocabulary, prompt + max_new_tokens within the session's KV capacity and the model's context.
// on_token(id) is called as each token is sampled.
GenerateResult generate(Session& session, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace bonsai
