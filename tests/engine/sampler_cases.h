// One SamplerOptions in a line, for the tests that run the same prompt under several sampler settings
// (the engine's sampler and session tests, the CUDA model test of the device picks).
#pragma once
#include <cstdint>

#include "engine/sampler.h"

namespace bonsai::testing_support {

inline SamplerOptions sampler_options(float temperature, int32_t top_k, float top_p, float min_p, float penalty,
                                      int32_t repeat_last_n, uint64_t seed) {
  SamplerOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.min_p = min_p;
  o.repeat_penalty = penalty;
  o.repeat_last_n = repeat_last_n;
  o.seed = seed;
  return o;
}

}  // namespace bonsai::testing_support
