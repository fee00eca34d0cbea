// A small deterministic RNG (splitmix64 + Box-Muller) so packs drawn from a seed are identical on every
// machine and standard library (std::normal_distribution is implementation-defined).
#pragma once
#include <cmath>
#include <cstdint>

namespace bonsai {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed ^ 0x9E3779B97F4A7C15ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Seed for a sub-stream (per tensor), so tensors can be drawn in any order or in parallel.
  static uint64_t mix(uint64_t seed, uint64_t stream) {
    Rng r(seed * 0x100000001B3ull + stream);
    return r.next();
  }

 private:
  uint64_t s_;
};

}  // namespace bonsai
