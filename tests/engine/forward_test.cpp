// Whole-model tests of the hybrid forward on the tiny pack (4 layers: 3 GDN + 1 full attention, block-1024
// Hadamard on every width, inverse-rotated embedding, untied head, vocabulary of ~1.5k).
//
// Thresholds (logits of the tiny pack reach |15|; every test prints its measured figures; the numbers in
// brackets were measured on the 2-core dev VM, AVX-512 kernels, f32 activations):
//   CPU (fp32) vs ref (fp64 ops), 32-token chunk + 8 steps: max|dlogit| <= 1e-3 [9.5e-6], mean KL <= 1e-7
//                                                    [1.4e-12], argmax 100% of counted (tie band 1e-3) [40/40];
//                                                    KV / conv / recurrent state rel err <= 1e-4 [6.2e-7]
//   three pack formats, same backend:                bit-identical logits
//   chunked (16 + 6, 64 + 64 + 22, ragged 13/64/37/5/31, the planner) vs the 150-token walk, cpu with
//   gdn_recurrent and with gdn_chunked: max|dlogit| <= 1e-3 [1.2e-5 / 3.9e-5], mean KL <= 1e-7 [4.7e-12],
//                                                    argmax 100% of counted [149/149]
//   ref: chunk (WY form) vs walk (recurrent form):    max|dlogit| <= 1e-4 [3.8e-6], mean KL <= 1e-9
//   pack forward vs float forward of its effective weights (rotated pack and --no-hadamard pack):
//                                                    max|dlogit| <= 2e-3 [1.1e-5 / 9.9e-6], mean KL <= 1e-6
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/tiles.h"
#include "backend/ref/ref_backend.h"
#include "engine/session.h"
#include "cpu_bounds.h"
#include "engine_test_util.h"
#include "float_forward.h"

using namespace bonsai;
using namespace bonsai::testing_support;

namespace {

// max |dlogit| and mean KL(ref || ours) of the CPU paths vs each other / vs the fp64 ref: 1e-3 / 1e-7, or the
// q16 default's stated 5e-3 (cpu_bounds.h).
void expect_close(const GateStats& s, double max_delta = cpu_max_delta(), double max_kl = cpu_max_kl()) {
  EXPECT_LE(s.max_delta, max_delta) << s.name;
  EXPECT_LE(s.mean_kl(), max_kl) << s.name;
  EXPECT_EQ(s.agree, s.counted) << s.name;
  EXPECT_GT(s.counted, s.positions / 2) << s.name << ": the tie band left too few positions to count";
}

}  // namespace

TEST(Forward, RejectsBadCalls) {
  const Model& m = tiny_model("pq2");
  CpuBackend be;
  Decoder dec(m, be, 16);
  DecoderState s = dec.new_state(8);
  std::vector<float> logits(size_t(dec.vocab()) * 16);
  const std::vector<int32_t> ids(17, 1);
  EXPECT_THROW(dec.forward(s, ids.data(), 17, LogitsMode::All, logits.data()), Error);  // > max_chunk
  EXPECT_THROW(dec.forward(s, ids.data(), 9, LogitsMode::All, logits.data()), Error);   // > capacity
  const int32_t bad[2] = {1, int32_t(dec.vocab())};
  EXPECT_THROW(dec.forward(s, bad, 2, LogitsMode::Last, logits.data()), Error);
  EXPECT_EQ(s.pos, 0);  // nothing ran
  dec.forward(s, ids.data(), 8, LogitsMode::Last, logits.data());
  EXPECT_EQ(s.pos, 8);
  EXPECT_THROW(dec.forward(s, ids.data(), 1, LogitsMode::Last, logits.data()), Error);  // full
}

TEST(Forward, CpuMatchesRef) {
  const Model& m = tiny_model("pq2");
  RefBackend rb;
  CpuBackend cb;
  Decoder ref(m, rb), cpu(m, cb);
  const auto tokens = test_tokens(40, ref.vocab(), 11);
  // One chunk of 32 (GEMM paths, attention_prefill, chunked delta rule on ref) then 8 decode steps.
  std::vector<int64_t> steps{32};
  for (int i = 0; i < 8; ++i) steps.push_back(1);
  DecoderState rs, cs;
  const auto lr = run_steps(ref, tokens, steps, &rs);
  const auto lc = run_steps(cpu, tokens, steps, &cs);
  expect_close(compare("cpu vs ref, 32 + 8 walked", lr, lc, ref.vocab()));
  // The states after 40 tokens: KV caches and GDN conv / recurrent state.
  double worst = 0;
  for (size_t l = 0; l < rs.layers.size(); ++l) {
    const LayerState &a = rs.layers[l], &b = cs.layers[l];
    for (auto [x, y] : {std::pair{&a.k, &b.k}, {&a.v, &b.v}, {&a.conv, &b.conv}, {&a.recurrent, &b.recurrent}}) {
      if (!*x) continue;
      const double e = max_rel(host_copy(cb, *y), host_copy(rb, *x));
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-4) << "layer " << l;
    }
  }
  std::printf("    states (KV, conv, recurrent) cpu vs ref: max rel err %.3g\n", worst);
}

// The CPU's tiled weights (built by prepare when the kernels can read them) against the canonical blocks:
// the same integer group dots, fp32 sums in another order at M = 1 (each op agrees to ~1e-7 relative), so
// the bound is the integer-activation path's own (cpu_bounds.h): a 1e-7 change of an activation can move
// a digit's rounding, which the tiny model then carries (measured 1.2e-3, KL 8e-9 at q16).
TEST(Forward, CpuTiledWeightsMatchCanonical) {
  const Model& m = tiny_model("pq2");
  CpuBackend tiled;
  CpuBackend::Options o;
  o.tile_weights = false;
  CpuBackend canon(o);
  Decoder a(m, tiled), b(m, canon);
  EXPECT_EQ(canon.weight_tiles().count(), 0u);
  if (!cpu::kernels().ternary_tiles_q8_x1) GTEST_SKIP() << cpu::kernels_name() << " kernels read no tiles";
  // Every linear of every layer (4 attention or 3 GDN, plus gate, up, down) and the head.
  size_t linears = 1;
  for (const LayerWeights& l : m.layers) linears += (l.full_attention ? 4 : 3) + 3;
  uint64_t bytes = 0;
  for (const TernaryMatrix* w : m.ternary_matrices())
    if (w != &m.embed) bytes += cpu::tiled_bytes(w->rows, w->cols);
  EXPECT_EQ(tiled.weight_tiles().count(), linears);
  EXPECT_EQ(tiled.weight_tiles().bytes(), bytes);
  // A second Decoder of the same model on this backend keeps the tiles it finds (same buffers).
  const uint8_t* head_tiles = tiled.weight_tiles().find(m.head);
  ASSERT_NE(head_tiles, nullptr);
  EXPECT_EQ(tiled.weight_tiles().builds(), 1);
  { Decoder again(m, tiled); }
  EXPECT_EQ(tiled.weight_tiles().builds(), 1);
  EXPECT_EQ(tiled.weight_tiles().find(m.head), head_tiles);
  EXPECT_EQ(tiled.weight_tiles().count(), linears);
  const auto tokens = test_tokens(40, a.vocab(), 14);
  std::vector<int64_t> steps{32};
  for (int i = 0; i < 8; ++i) steps.push_back(1);
  expect_close(compare("tiled vs canonical CPU weights, 32 + 8 walked", run_steps(b, tokens, steps),
                       run_steps(a, tokens, steps), a.vocab()));
}

TEST(Forward, AllFormatsGiveIdenticalLogits) {
  CpuBackend cb;
  std::vector<std::vector<float>> out;
  for (const char* f : {"pq2", "ptq1", "mlx"}) {
    Decoder dec(tiny_model(f), cb);
    const auto tokens = test_tokens(24, dec.vocab(), 12);
    out.push_back(run_steps(dec, tokens, {16, 1, 1, 1, 1, 1, 1, 1, 1}));
  }
  ASSERT_EQ(out[0].size(), out[1].size());
  ASSERT_EQ(out[0].size(), out[2].size());
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4), 0) << "PQ2_0 vs PTQ1_0";
  EXPECT_EQ(std::memcmp(out[0].data(), out[2].data(), out[0].size() * 4), 0) << "PQ2_0 vs MLX";
}

TEST(Forward, ChunkedPrefillMatchesTokenWalkCpu) {
  const Model& m = tiny_model("pq2");
  for (bool chunked_gdn : {false, true}) {
    CpuBackend::Options o;
    o.gdn_chunked = chunked_gdn;
    CpuBackend cb(o);
    Decoder dec(m, cb);
    const auto tokens = test_tokens(150, dec.vocab(), 13);
    const auto base = run_steps(dec, tokens, walk(tokens.size()));
    const std::string tag = chunked_gdn ? " (gdn_chunked)" : " (gdn_recurrent)";
    std::vector<int64_t> c16(9, 16);
    c16.push_back(6);  // 150 = 9 * 16 + 6
    expect_close(compare("chunks of 16 + ragged 6 vs walk" + tag, base, run_steps(dec, tokens, c16), dec.vocab()));
    expect_close(compare("chunks of 64, 64, ragged 22 vs walk" + tag, base, run_steps(dec, tokens, {64, 64, 22}),
                         dec.vocab()));
    expect_close(compare("ragged 13, 64, 37, 5, 31 vs walk" + tag, base,
                         run_steps(dec, tokens, {13, 64, 37, 5, 31}), dec.vocab()));
    // The planner's plan: 64 + 64 + a ragged 22.
    std::vector<int64_t> plan = plan_prefill(150, std::vector<int64_t>{64, 16});
    expect_close(compare("planner (64, 64, ragged 22) vs walk" + tag, base, run_steps(dec, tokens, plan), dec.vocab()));
  }
}

TEST(Forward, ChunkedPrefillMatchesTokenWalkRef) {
  // The reference backend runs the chunked WY form of the delta rule for a chunk and the recurrent form
  // for a step: two different algorithms in fp64.
  const Model& m = tiny_model("pq2");
  RefBackend rb;
  Decoder dec(m, rb);
  const auto tokens = test_tokens(20, dec.vocab(), 14);
  const auto base = run_steps(dec, tokens, walk(tokens.size()));
  expect_close(compare("ref: one chunk of 13 + ragged 7 vs walk", base, run_steps(dec, tokens, {13, 7}), dec.vocab()),
               1e-4, 1e-9);
}

TEST(Forward, ResetEqualsFreshState) {
  const Model& m = tiny_model("pq2");
  CpuBackend cb;
  Decoder dec(m, cb);
  const auto a = test_tokens(30, dec.vocab(), 15), b = test_tokens(20, dec.vocab(), 16);
  const size_t V = size_t(dec.vocab());
  DecoderState s = dec.new_state(64);
  std::vector<float> l1(V * 20), l2(V * 20);
  dec.forward(s, a.data(), 30, LogitsMode::None, nullptr);
  dec.reset(s);
  EXPECT_EQ(s.pos, 0);
  dec.forward(s, b.data(), 20, LogitsMode::All, l1.data());
  DecoderState fresh = dec.new_state(64);
  dec.forward(fresh, b.data(), 20, LogitsMode::All, l2.data());
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * 4), 0);
}

TEST(Forward, RotatedPackMatchesFloatForwardOfItsEffectiveWeights) {
  // The rotation is exact: W' = W R^T, so the pack's forward (sign + FWHT at every site, ternary W',
  // inverse-rotated embedding) must equal a plain float forward of its effective weights R^T W'.
  const Model& m = tiny_model("pq2");
  ASSERT_TRUE(m.hadamard.enabled);
  CpuBackend cb;
  Decoder dec(m, cb);
  const auto tokens = test_tokens(24, dec.vocab(), 17);
  const auto ours = run_steps(dec, tokens, {16, 8});
  const auto want = float_forward(tiny_packs().effective, tokens);
  expect_close(compare("rotated pack vs float forward (effective)", want, ours, dec.vocab()),
               std::max(2e-3, cpu_max_delta()), 1e-6);
}

TEST(Forward, UnrotatedPackRunsAndMatchesItsEffectiveWeights) {
  // make-pack --no-hadamard: the same float model ternarised without the rotation. No transforms run
  // (nothing is folded); its logits must equal the float forward of ITS effective weights. Against the
  // rotated pack only a loose agreement is expected (ternarisation of W vs of W R^T differ): printed.
  const Model& m = tiny_model("nohad");
  EXPECT_FALSE(m.hadamard.enabled);
  EXPECT_FALSE(m.embed_inverse);
  for (const TernaryMatrix* t : m.ternary_matrices()) EXPECT_FALSE(t->folded) << t->name;
  CpuBackend cb;
  Decoder dec(m, cb);
  const auto tokens = test_tokens(24, dec.vocab(), 17);
  const auto ours = run_steps(dec, tokens, {16, 8});
  const auto want = float_forward(tiny_nohad_packs().effective, tokens);
  expect_close(compare("unrotated pack vs float forward (effective)", want, ours, dec.vocab()),
               std::max(2e-3, cpu_max_delta()), 1e-6);
  Decoder rot(tiny_model("pq2"), cb);
  compare("unrotated vs rotated pack (info only)", run_steps(rot, tokens, {16, 8}), ours, dec.vocab());
}
