// Shared helpers for the whole-model tests: the tiny packs (rotated, from tests/model/tiny_packs.h, and
// an unrotated set of the same float model), models loaded once per process, deterministic token
// sequences, teacher-forced runs with explicit chunk plans, and logit comparisons with the gate's metrics.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../model/tiny_packs.h"
#include "engine/gate.h"
#include "model/forward.h"
#include "util/error.h"
#include "model/pack.h"

namespace bonsai::testing_support {

// The tiny preset, seed 7, written with --no-hadamard (same float model, no rotation), once per ctest run.
inline const TinyPacks& tiny_nohad_packs() {
  static const TinyPacks p = [] {
    MakePackOptions o;
    o.seed = 7;
    o.hadamard = false;
    o.formats = {"gguf-pq2_0", "effective"};
    return write_packs_once("bonsai_tiny_nohad", o);
  }();
  return p;
}

// "pq2", "ptq1", "mlx" (the rotated tiny pack in each format) or "nohad" (unrotated, PQ2_0), loaded once.
inline const Model& tiny_model(const std::string& which) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[which];
  if (!m) {
    std::string path;
    if (which == "pq2") path = tiny_packs().pq2;
    else if (which == "ptq1") path = tiny_packs().ptq1;
    else if (which == "mlx") path = tiny_packs().mlx;
    else if (which == "nohad") path = tiny_nohad_packs().pq2;
    else throw std::runtime_error("tiny_model: unknown pack " + which);
    m = std::make_unique<Model>(load_model(path));
  }
  return *m;
}

// n token ids in [0, V), deterministic.
inline std::vector<int32_t> test_tokens(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(V));
  return t;
}

// Teacher-forced logits [n, V] of a fresh sequence fed in the given step sizes (sum = tokens.size()).
inline std::vector<float> run_steps(Decoder& dec, const std::vector<int32_t>& tokens, const std::vector<int64_t>& steps,
                                    DecoderState* keep_state = nullptr) {
  const int64_t V = dec.vocab();
  std::vector<float> out(tokens.size() * size_t(V));
  DecoderState s = dec.new_state(int64_t(tokens.size()));
  size_t off = 0;
  for (int64_t m : steps) {
    dec.forward(s, tokens.data() + off, m, LogitsMode::All, out.data() + off * size_t(V));
    off += size_t(m);
  }
  EXPECT_EQ(off, tokens.size());
  if (keep_state) *keep_state = std::move(s);
  return out;
}

inline std::vector<int64_t> walk(size_t n) { return std::vector<int64_t>(n, 1); }

// Gate metrics of `ours` against `ref` (both [T, V]); prints them under `what`.
inline GateStats compare(const std::string& what, const std::vector<float>& ref, const std::vector<float>& ours,
                         int64_t V, double tie_band = 1e-3) {
  GateStats s;
  s.name = what;
  EXPECT_EQ(ref.size(), ours.size());
  gate_compare(ref.data(), ours.data(), int64_t(ref.size()) / V, V, tie_band, s);
  double scale = 0;
  for (float x : ref) scale = std::max(scale, double(std::fabs(x)));
  std::printf("    %-44s positions %lld counted %lld agree %lld  max|dlogit| %.3g (max|logit| %.3g)  mean KL %.3g\n",
              what.c_str(), static_cast<long long>(s.positions), static_cast<long long>(s.counted),
              static_cast<long long>(s.agree), s.max_delta, scale, s.mean_kl());
  return s;
}

// max |a - b| / max |b| over two buffers of the same size (host copies of states).
inline double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? err / scale : err;
}

inline std::vector<float> host_copy(Backend& be, const Buffer& b) {
  std::vector<float> h(b.size());
  be.copy_to_host(b.data(), b.size(), h.data());
  return h;
}

// The message of the bonsai::Error f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace bonsai::testing_support
