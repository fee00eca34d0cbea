// The parity gate (engine/gate.h) against a fixture produced with the reference backend: the CPU backend
// passes it with every chunk mode, a corrupted fixture fails it, malformed fixtures are refused clearly.
// Bounds used: --max-delta 1e-3, --max-kl 1e-7, tie band 1e-3 (the figures are printed).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <cstring>
#include <functional>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "format/safetensors.h"
#include "util/error.h"
#include "cpu_bounds.h"
#include "ref_fixture.h"

using namespace bonsai;
using namespace bonsai::testing_support;
using ::testing::HasSubstr;

namespace {

// The CPU backend's bounds at its activation precision (cpu_bounds.h): 1e-3 / 1e-7, or the q16 default's 5e-3.
GateOptions bounds(double max_delta = cpu_max_delta()) {
  GateOptions o;
  o.max_delta = max_delta;
  o.max_kl = cpu_max_kl();
  return o;
}

void print(const std::string& what, const GateReport& r) {
  const GateStats& o = r.overall;
  std::printf("    %-28s positions %lld counted %lld agree %lld max|dlogit| %.3g mean KL %.3g -> %s\n", what.c_str(),
              static_cast<long long>(o.positions), static_cast<long long>(o.counted), static_cast<long long>(o.agree),
              o.max_delta, o.mean_kl(), r.pass() ? "pass" : "FAIL");
}


}  // namespace

TEST(Gate, FixtureRoundTrip) {
  const GateFixture fx = read_gate_fixture(ref_fixture_path());
  ASSERT_EQ(fx.prompts.size(), 2u);
  EXPECT_EQ(fx.prompts[0].name, "text");
  EXPECT_EQ(fx.prompts[1].name, "random");
  EXPECT_EQ(fx.vocab, tiny_model("pq2").config.vocab);
  EXPECT_EQ(fx.metadata.at("prompts"), "2");
  EXPECT_EQ(fx.metadata.at("pack"), "tiny, seed 7, PQ2_0");
  for (const GatePrompt& p : fx.prompts) EXPECT_EQ(p.logits.size(), p.tokens.size() * size_t(fx.vocab));
}

TEST(Gate, CpuPassesAgainstTheRefFixtureInEveryChunkMode) {
  const GateFixture fx = read_gate_fixture(ref_fixture_path());
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  for (auto [name, chunks] : {std::pair<const char*, std::vector<int64_t>>{"auto", SessionOptions{}.chunks},
                              {"64, 16", {64, 16}},
                              {"1", {}},
                              {"16", {16}},
                              {"64", {64}}}) {
    SessionOptions so;
    so.chunks = chunks;
    const GateReport r = run_gate(dec, fx, bounds(), so);
    print(std::string("cpu, chunk ") + name, r);
    EXPECT_TRUE(r.pass()) << name << ": " << (r.failures.empty() ? "" : r.failures[0]);
    EXPECT_EQ(r.overall.positions, int64_t(fx.prompts[0].tokens.size() + fx.prompts[1].tokens.size()));
    EXPECT_GT(r.overall.counted, r.overall.positions * 3 / 4);
  }
}

TEST(Gate, RefWalkPassesAgainstItsOwnChunk) {
  GateFixture fx = read_gate_fixture(ref_fixture_path());
  fx.prompts.resize(1);  // the 15-token prompt: a ref walk costs ~0.1 s a token
  RefBackend rb;
  Decoder dec(tiny_model("pq2"), rb);
  GateOptions o = bounds();
  o.max_delta = 1e-4;
  SessionOptions so;
  so.chunks = {};
  const GateReport r = run_gate(dec, fx, o, so);
  print("ref, walk vs ref one chunk", r);
  EXPECT_TRUE(r.pass());
}

TEST(Gate, CorruptedFixtureFails) {
  GateFixture fx = read_gate_fixture(ref_fixture_path());
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  const int64_t V = fx.vocab;
  SessionOptions so;
  {  // A counted position whose reference argmax is moved to another token: agreement < 100%.
    GateFixture bad = fx;
    float* row = bad.prompts[1].logits.data() + 5 * V;
    const int32_t top = greedy_argmax(std::span<const float>(row, size_t(V)));
    row[(top + 1) % V] = row[top] + 1.0f;
    const GateReport r = run_gate(dec, bad, bounds(), so);
    print("moved argmax", r);
    EXPECT_FALSE(r.pass());
    EXPECT_EQ(r.overall.agree + 1, r.overall.counted);
    EXPECT_THAT(r.failures.at(0), HasSubstr("argmax agreement"));
    // --min-agreement: a stated looser bound passes one miss when it allows it, and fails just above it.
    GateOptions loose;  // agreement only (the moved logit is also far outside max |delta|)
    const double got = r.overall.agreement();
    loose.min_agreement = got;
    EXPECT_TRUE(run_gate(dec, bad, loose, so).pass()) << got;
    loose.min_agreement = std::nextafter(got, 1.0);
    const GateReport above = run_gate(dec, bad, loose, so);
    EXPECT_FALSE(above.pass());
    EXPECT_THAT(above.failures.at(0), HasSubstr("--min-agreement"));
  }
  {  // A constant shift of one row: same softmax and argmax, but |delta| = 0.01 > 1e-3.
    GateFixture bad = fx;
    for (int64_t v = 0; v < V; ++v) bad.prompts[0].logits[size_t(3 * V + v)] += 0.01f;
    const GateReport r = run_gate(dec, bad, bounds(), so);
    print("shifted row", r);
    EXPECT_FALSE(r.pass());
    ASSERT_EQ(r.failures.size(), 1u);
    EXPECT_THAT(r.failures[0], HasSubstr("--max-delta"));
  }
  {  // Noise on every logit: KL above the bound.
    GateFixture bad = fx;
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (auto& p : bad.prompts)
      for (auto& x : p.logits) x += d(rng);
    GateOptions o = bounds();
    o.max_delta = 1.0;
    const GateReport r = run_gate(dec, bad, o, so);
    print("noisy logits", r);
    EXPECT_FALSE(r.pass());
    bool kl = false;
    for (const auto& f : r.failures) kl |= f.find("--max-kl") != std::string::npos;
    EXPECT_TRUE(kl);
  }
}

TEST(Gate, TieBandExcludesNearTies) {
  GateFixture fx = read_gate_fixture(ref_fixture_path());
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  const int64_t V = fx.vocab;
  const GateReport clean = run_gate(dec, fx, bounds(), {});
  // Make position 7 of "random" a near tie (margin 1e-4 < band) with the runner-up being a token we do
  // NOT pick: it must drop out of the counted set instead of failing the gate.
  float* row = fx.prompts[1].logits.data() + 7 * V;
  const int32_t top = greedy_argmax(std::span<const float>(row, size_t(V)));
  const int32_t other = (top + 1) % V;
  row[other] = row[top] + 1e-4f;
  GateOptions o = bounds();
  o.max_delta = 1e9;
  o.max_kl = 1e9;
  const GateReport r = run_gate(dec, fx, o, {});
  EXPECT_EQ(r.overall.counted, clean.overall.counted - 1);
  EXPECT_TRUE(r.pass());
}

TEST(Gate, MalformedFixturesAreRefusedClearly) {
  const std::string dir = tiny_packs().dir;
  auto write = [&](const std::string& name, const std::function<void(SafetensorsWriter&)>& fill) {
    SafetensorsWriter w;
    fill(w);
    const std::string p = dir + "/" + name + "_" + std::to_string(getpid()) + ".safetensors";
    w.write(p);
    return p;
  };
  auto i32 = [](std::vector<int32_t> v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  auto f32 = [](size_t n) { return std::vector<uint8_t>(n * 4, 0); };
  const std::string no_count = write("no_count", [&](SafetensorsWriter& w) { w.add("p0.tokens", StDtype::I32, {2}, i32({1, 2})); });
  EXPECT_THAT(error_of([&] { read_gate_fixture(no_count); }), HasSubstr("without the metadata key 'prompts'"));
  const std::string missing = write("missing", [&](SafetensorsWriter& w) {
    w.set_metadata("prompts", "2");
    w.add("p0.tokens", StDtype::I32, {2}, i32({1, 2}));
    w.add("p0.logits", StDtype::F32, {2, 8}, f32(16));
  });
  EXPECT_THAT(error_of([&] { read_gate_fixture(missing); }), HasSubstr("'p1.tokens' is missing"));
  const std::string dtype = write("dtype", [&](SafetensorsWriter& w) {
    w.set_metadata("prompts", "1");
    w.add("p0.tokens", StDtype::F32, {2}, f32(2));
    w.add("p0.logits", StDtype::F32, {2, 8}, f32(16));
  });
  EXPECT_THAT(error_of([&] { read_gate_fixture(dtype); }), HasSubstr("'p0.tokens' must be I32 [T]"));
  const std::string shape = write("shape", [&](SafetensorsWriter& w) {
    w.set_metadata("prompts", "1");
    w.add("p0.tokens", StDtype::I32, {2}, i32({1, 2}));
    w.add("p0.logits", StDtype::F32, {3, 8}, f32(24));
  });
  EXPECT_THAT(error_of([&] { read_gate_fixture(shape); }), HasSubstr("'p0.logits' must be F32 [2, V]"));
  const std::string names = write("names", [&](SafetensorsWriter& w) {
    w.set_metadata("prompts", "1");
    w.set_metadata("names", "[\"a\", \"b\"]");
    w.add("p0.tokens", StDtype::I32, {2}, i32({1, 2}));
    w.add("p0.logits", StDtype::F32, {2, 8}, f32(16));
  });
  EXPECT_THAT(error_of([&] { read_gate_fixture(names); }), HasSubstr("'names' must be a JSON list of 1 names"));
  // Well-formed, but not for this pack: V = 8, then an id outside the vocabulary.
  const std::string small_v = write("small_v", [&](SafetensorsWriter& w) {
    w.set_metadata("prompts", "1");
    w.add("p0.tokens", StDtype::I32, {2}, i32({1, 2}));
    w.add("p0.logits", StDtype::F32, {2, 8}, f32(16));
  });
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  EXPECT_THAT(error_of([&] { run_gate(dec, read_gate_fixture(small_v), {}, {}); }),
              HasSubstr("V = 8, the pack's vocabulary has"));
  GateFixture fx = read_gate_fixture(ref_fixture_path());
  fx.prompts[0].tokens[2] = int32_t(fx.vocab) + 5;
  EXPECT_THAT(error_of([&] { run_gate(dec, fx, {}, {}); }), HasSubstr("outside the vocabulary"));
}
