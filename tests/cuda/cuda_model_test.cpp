// The tiny pack (the real structure at a few MB: block-1024 Hadamard, GVA 3, GQA 6, one full-attention
// layer, untied head, inverse-rotated embedding) through the hybrid forward on CUDA vs the reference
// backend: a 29-token prefill chunk (LogitsMode::All) then 19 decode steps, every logit compared.
//
// The pack: $BONSAI_TINY_PACK, else written by `bonsai make-pack --preset tiny` (the binary this build
// made). Skipped without a CUDA device.
//
// Stated tolerance, as a fraction of max |reference logit| (the scale): q16 activations (the default: two
// int8 digits per element; measured 0.010-0.013% on the H200) max |delta logit| <= 0.1%, top-1 agreement
// on every position whose reference top-2 margin exceeds 0.5% of the scale; q8 (one digit; measured 3.0%)
// 5% and a 5% tie band.
// Graphs on/off, whole or in segments, must agree bit for bit (same kernels, same order). Options::exact (fp32 activations):
// max |delta logit| <= 0.2% of the scale.
// The fixture gate (HF reference, tiny seed-7 pack, tests/data/fixtures/tiny_seed7.safetensors): the q16
// default passes `bonsai gate`'s bounds (100% argmax outside the 1e-3 tie band, max |dlogit| <= 5e-3, the
// CPU q16 bound, mean KL <= 1e-7).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/ref/ref_backend.h"
#include "cuda_test_util.h"
#include "../engine/sampler_cases.h"
#include "engine/gate.h"
#include "engine/session.h"
#include "engine/sampler.h"
#include "model/forward.h"
#include "model/pack.h"

namespace bonsai {
namespace {

std::string tiny_pack_path() {
  if (const char* p = std::getenv("BONSAI_TINY_PACK")) return p;
  static const std::string made = [] {
    const std::string dir = ::testing::TempDir() + "/bonsai_cuda_tiny_" + std::to_string(::getpid());
#ifdef BONSAI_BINARY
    const std::string cmd = std::string(BONSAI_BINARY) + " make-pack --preset tiny --format gguf-pq2_0 -o " + dir +
                            " > /dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) return std::string();
#else
    return std::string();
#endif
    return dir + "/tiny-pq2_0.gguf";
  }();
  return made;
}

struct ModelRun {
  std::vector<float> logits;  // [positions, V]
};

constexpr int64_t kTokens = 48, kPrefill = 29;

std::vector<int32_t> token_ids(int64_t vocab) {
  std::mt19937 rng(11);
  std::vector<int32_t> ids(static_cast<size_t>(kTokens));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(vocab));
  return ids;
}

ModelRun run_model(const Model& m, Backend& be, const std::vector<int32_t>& ids, int64_t prefill) {
  Decoder dec(m, be, 64);
  DecoderState s = dec.new_state(128);
  const int64_t V = dec.vocab();
  ModelRun r;
  r.logits.resize(size_t(kTokens * V));
  if (prefill > 0) dec.forward(s, ids.data(), prefill, LogitsMode::All, r.logits.data());
  for (int64_t t = prefill; t < kTokens; ++t) dec.forward(s, ids.data() + t, 1, LogitsMode::Last, r.logits.data() + t * V);
  return r;
}

struct Compare {
  double max_delta = 0, scale = 0;
  int64_t counted = 0, agree = 0;
};

// tie: reference top-2 margins below tie * scale are not counted for top-1 agreement.
Compare compare(const ModelRun& got, const ModelRun& want, int64_t V, double tie = 0.05) {
  Compare c;
  for (float w : want.logits) c.scale = std::max(c.scale, std::fabs(double(w)));
  for (size_t i = 0; i < got.logits.size(); ++i) {
    const double d = std::fabs(double(got.logits[i]) - double(want.logits[i]));
    c.max_delta = std::isfinite(got.logits[i]) ? std::max(c.max_delta, d) : INFINITY;
  }
  for (int64_t p = 0; p < kTokens; ++p) {
    const float* w = want.logits.data() + p * V;
    const float* g = got.logits.data() + p * V;
    int64_t b1 = 0, b2 = -1, gb = 0;
    for (int64_t i = 1; i < V; ++i) {
      if (w[i] > w[b1]) {
        b2 = b1;
        b1 = i;
      } else if (b2 < 0 || w[i] > w[b2]) {
        b2 = i;
      }
      if (g[i] > g[gb]) gb = i;
    }
    if (double(w[b1]) - double(w[b2]) < tie * c.scale) continue;  // tie band
    ++c.counted;
    c.agree += gb == b1;
  }
  return c;
}

TEST(CudaModel, TinyPackMatchesReference) {
  BONSAI_REQUIRE_GPU();
  const std::string path = tiny_pack_path();
  if (path.empty() || !std::filesystem::exists(path)) GTEST_SKIP() << "no tiny pack (set BONSAI_TINY_PACK)";
  const Model m = load_model(path);
  const auto ids = token_ids(m.config.vocab);
  const int64_t V = m.head.rows;
  RefBackend refb;
  const ModelRun want = run_model(m, refb, ids, kPrefill);

  struct Config {
    const char* name;
    CudaBackend::Options o;
  };
  std::vector<Config> configs(35);
  configs[0].name = "default";  // q16
  configs[1].name = "no-graphs";
  configs[1].o.graphs = false;
  configs[2].name = "no-fuse";
  configs[2].o.fuse = false;
  configs[3].name = "no-tensor-cores";
  configs[3].o.tensor_cores = false;
  configs[4].name = "no-pdl";
  configs[4].o.pdl = false;
  configs[5].name = "fuse-norm";
  configs[5].o.fuse_norm = true;
  configs[6].name = "exact";  // fp32 activations in the ternary products: only fp32 rounding remains
  configs[6].o.exact = true;
  configs[7].name = "q8 fuse-site";  // the decode sites as matvec prologues, not site kernels (q8 only)
  configs[7].o.fuse_site = true;
  configs[7].o.act_levels = 1;
  configs[8].name = "q8 bulk-matvec";  // matvec v4 (bulk copies) for M = 1 (q8 only)
  configs[8].o.matvec = 4;
  configs[8].o.act_levels = 1;
  configs[9].name = "q8";
  configs[9].o.act_levels = 1;
  configs[10].name = "v3 no-prefetch";  // the v3 matvec (round 8: v6 is the default) without its L2 prefetch
  configs[10].o.l2_prefetch = false;
  configs[10].o.matvec = 3;
  configs[11].name = "v3 fixed-ranges";  // the v3 matvec's round-5 grid (fixed row groups per warp)
  configs[11].o.matvec_balance = false;
  configs[11].o.matvec = 3;
  configs[12].name = "gemm-v1";  // the mma.sync GEMM (the default is v3 on sm_90, v1 elsewhere)
  configs[12].o.gemm = 1;
  configs[13].name = "v3";  // the dp4a matvec v3 (round 8: the tensor-core v6 is the default)
  configs[13].o.matvec = 3;
  configs[14].name = "site-prologue";  // round 11: the decode sites computed by the v7 matvec that reads them
  configs[14].o.site_prologue = 1;
  configs[15].name = "no-site-prologue";
  configs[15].o.site_prologue = 0;
  configs[16].name = "graph-segments 7";  // round 14: a step's graph launched in segments as it is recorded
  configs[16].o.graph_segment = 7;
  configs[17].name = "one-graph";  // a step as one graph (the default launches it in segments of 64 kernels)
  configs[17].o.graph_segment = 0;
  configs[18].name = "v3 segments 5";  // the v3 matvec's L2 prefetch hook patches launches across segment ends
  configs[18].o.matvec = 3;
  configs[18].o.graph_segment = 5;
  configs[19].name = "ffn-three-launches";  // round 30's fused FFN is the default since round 33: the launches it replaces
  configs[19].o.ffn_fused = false;
  configs[20].name = "ffn-fused q8";
  configs[20].o.ffn_fused = true;
  configs[20].o.act_levels = 1;
  configs[21].name = "ffn-fused no-graphs";
  configs[21].o.ffn_fused = true;
  configs[21].o.graphs = false;
  configs[22].name = "ffn-fused rows16";  // its 16-row gate / up stages (the default 32): the same sums
  configs[22].o.ffn_fused = true;
  configs[22].o.ffn_rows = 16;
  configs[23].name = "delta-out";  // round 31: a decode token's gdn_out in the delta step's launch (partials to AddNorm)
  configs[23].o.delta_out = true;
  configs[24].name = "delta-out q8";
  configs[24].o.delta_out = true;
  configs[24].o.act_levels = 1;
  configs[25].name = "delta-conv";  // round 29: the decode step's conv and a / b pair in its own launch
  configs[25].o.delta_conv = true;
  configs[26].name = "delta-conv-out";  // both, with the fused FFN: the decode chain of rounds 29-31 together
  configs[26].o.delta_conv = true;
  configs[26].o.delta_out = true;
  configs[26].o.ffn_fused = true;
  configs[27].name = "delta-conv chunked";  // the chunked delta rule even at one token: the conv must stay its own launch
  configs[27].o.delta_conv = true;
  configs[27].o.delta = 2;
  configs[28].name = "ffn-fused bulk-rows";  // round 30's ffn_down copies, a bulk copy a row (the default: tensor maps)
  configs[28].o.ffn_fused = true;
  configs[28].o.ffn_b_copy = 0;
  configs[29].name = "ffn-fused cp.async";  // round 33: ffn_down's stages copied by the producer's lanes
  configs[29].o.ffn_fused = true;
  configs[29].o.ffn_b_copy = 1;
  configs[30].name = "ffn-fused balance2";  // round 34: gate / up rows over all blocks, both phases' bytes even
  configs[30].o.ffn_balance = 2;
  configs[31].name = "ffn-fused lane fences";  // round 36's default arrival: a fence per lane, relaxed adds (round 37:
  configs[31].o.ffn_release = false;           // the default is one red.release by lane 0)
  configs[32].name = "ffn-fused own sum";  // round 37: the kernel sums its chunk partials (the site reads one delta)
  configs[32].o.ffn_reduce = true;
  configs[33].name = "ffn-fused early 1";  // round 37: one stage streamed before the wait, the rest after
  configs[33].o.ffn_early = 1;
  configs[34].name = "v7 early 1";  // round 37: the products' copies after their wait but the first stage's
  configs[34].o.matvec7_early = 1;
  std::vector<ModelRun> runs;
  std::vector<uint64_t> nodes;
  for (const Config& cfg : configs) {
    CudaBackend be(cfg.o);
    runs.push_back(run_model(m, be, ids, kPrefill));
    nodes.push_back(be.stats().last_step_nodes);
    if (&cfg == &configs[0])  // the segments fall at the same launches every step: cached, not rebuilt
      EXPECT_LT(be.stats().graph_builds * 4, be.stats().graph_launches) << cfg.name;
    const bool q8 = cfg.o.act_levels == 1 && !cfg.o.exact;
    const Compare c = compare(runs.back(), want, V, q8 ? 0.05 : 0.005);
    std::printf("[tiny %-16s] max|dlogit| %.5f (max|logit| %.3f, %.3f%%), top-1 %lld/%lld; graph nodes/step %llu\n",
                cfg.name, c.max_delta, c.scale, 100.0 * c.max_delta / c.scale, (long long)c.agree,
                (long long)c.counted, (unsigned long long)be.stats().last_step_nodes);
    RecordProperty(std::string("max_dlogit_") + cfg.name, std::to_string(c.max_delta));
    EXPECT_LE(c.max_delta, (cfg.o.exact ? 0.002 : q8 ? 0.05 : 0.001) * c.scale) << cfg.name;
    EXPECT_EQ(c.agree, c.counted) << cfg.name;
  }
  // graphs (whole or in segments) change how kernels are launched, never what they compute
  EXPECT_EQ(runs.at(0).logits, runs.at(1).logits);
  EXPECT_EQ(runs.at(1).logits, runs.at(4).logits);
  EXPECT_EQ(runs.at(0).logits, runs.at(16).logits);
  EXPECT_EQ(runs.at(0).logits, runs.at(17).logits);
  EXPECT_EQ(runs.at(13).logits, runs.at(18).logits);
  // a prefetch is a hint, and a v3 matvec row's sum does not depend on which warp computes it
  EXPECT_EQ(runs.at(13).logits, runs.at(10).logits);
  EXPECT_EQ(runs.at(13).logits, runs.at(11).logits);
  // the fused FFN ran (the default): 4 layers x (gate+up, the SwiGLU site, ffn_down -> one launch) fewer graph nodes a
  // decode step than the three launches
  EXPECT_EQ(nodes.at(0) + 8, nodes.at(19));
  EXPECT_EQ(nodes.at(20), nodes.at(0));
  EXPECT_EQ(runs.at(0).logits, runs.at(21).logits);
  EXPECT_EQ(runs.at(0).logits, runs.at(22).logits);
  EXPECT_EQ(runs.at(0).logits, runs.at(28).logits) << "ffn_down's stages copied by a bulk copy a row";
  EXPECT_EQ(runs.at(0).logits, runs.at(29).logits) << "ffn_down's stages copied by cp.async lanes";
  EXPECT_EQ(nodes.at(28), nodes.at(0));
  EXPECT_EQ(runs.at(0).logits, runs.at(30).logits) << "gate / up rows over all blocks (balance 2)";
  EXPECT_EQ(nodes.at(30), nodes.at(0));
  EXPECT_EQ(runs.at(0).logits, runs.at(31).logits) << "the barrier's arrival as one release";
  EXPECT_EQ(nodes.at(31), nodes.at(0));
  EXPECT_EQ(runs.at(0).logits, runs.at(32).logits) << "the partials summed by the FFN kernel, in the site's order";
  EXPECT_EQ(nodes.at(32), nodes.at(0));
  EXPECT_EQ(runs.at(0).logits, runs.at(33).logits) << "the FFN's copies issued after its wait";
  EXPECT_EQ(runs.at(0).logits, runs.at(34).logits) << "v7's copies issued after its wait";
  // the fused out projection ran: 3 GDN layers x (the step, gdn_out -> one launch) fewer; the conv: one fewer each;
  // both (with the fused FFN, the default): 3 + 3
  EXPECT_EQ(nodes.at(23) + 3, nodes.at(0));
  EXPECT_EQ(nodes.at(25) + 3, nodes.at(0));
  EXPECT_EQ(nodes.at(26) + 6, nodes.at(0));
  EXPECT_EQ(runs.at(25).logits, runs.at(0).logits) << "the fused conv computes the same values";
}

// Token walk vs chunked prefill on CUDA (matvec + recurrent delta rule vs GEMM + the same kernel over a
// chunk): the logits after the last prompt token agree within the q16 tolerance (0.1% of the scale;
// measured 0.010% on the H200).
TEST(CudaModel, WalkAndChunkAgree) {
  BONSAI_REQUIRE_GPU();
  const std::string path = tiny_pack_path();
  if (path.empty() || !std::filesystem::exists(path)) GTEST_SKIP() << "no tiny pack (set BONSAI_TINY_PACK)";
  const Model m = load_model(path);
  const auto ids = token_ids(m.config.vocab);
  const int64_t V = m.head.rows;
  CudaBackend be;
  const ModelRun walk = run_model(m, be, ids, 0);
  const ModelRun chunk = run_model(m, be, ids, kPrefill);
  const Compare c = compare(chunk, walk, V);
  std::printf("[tiny walk vs chunk] max|dlogit| %.5f (%.3f%%)\n", c.max_delta, 100.0 * c.max_delta / c.scale);
  EXPECT_LE(c.max_delta, 0.001 * c.scale);
}


// Decode at batch 1 picks its token on the device (Session::append_kept + next_token): the argmax for
// greedy (CudaBackend::argmax_rows: 4 bytes to the host), the top-k candidates for top-k sampling with or
// without top-p / min-p / a penalty (CudaBackend::top_k), the host copy for top-k off. Same tokens, same
// seeds, as Sampler::sample over the logits copied to the host: a 40-token prompt, then 10 tokens.
TEST(CudaModel, NextTokenOnTheDeviceEqualsSamplingTheLogits) {
  BONSAI_REQUIRE_GPU();
  const std::string path = tiny_pack_path();
  if (path.empty() || !std::filesystem::exists(path)) GTEST_SKIP() << "no tiny pack (set BONSAI_TINY_PACK)";
  const Model m = load_model(path);
  CudaBackend be;
  Decoder dec(m, be);
  std::vector<int32_t> prompt = token_ids(m.config.vocab);
  prompt.resize(std::min<size_t>(prompt.size(), 40));
  auto opts = [](float temp, int32_t top_k, float top_p, float min_p, float penalty) {
    return bonsai::testing_support::sampler_options(temp, top_k, top_p, min_p, penalty, 64, 5);
  };
  for (const SamplerOptions& o : {opts(0, 0, 1, 0, 1), opts(0, 0, 1, 0, 1.3f), opts(1.2f, 40, 0.9f, 0, 1.2f),
                                  opts(1.0f, 20, 1, 0.05f, 1), opts(1.5f, 0, 0.9f, 0, 1)}) {
    Sampler sa(o, dec.vocab()), sb(o, dec.vocab());
    Session a(dec), b(dec);
    const std::span<const float> l0 = a.append(prompt);
    int32_t ta = sa.sample(l0, a.history());
    b.append_kept(prompt);
    int32_t tb = b.next_token(sb, b.history());
    for (int step = 0; step < 10; ++step) {
      ASSERT_EQ(ta, tb) << "temperature " << o.temperature << " top_k " << o.top_k << " step " << step;
      const std::span<const float> la = a.append(std::span<const int32_t>(&ta, 1));
      ta = sa.sample(la, a.history());
      b.append_kept(std::span<const int32_t>(&tb, 1));
      tb = b.next_token(sb, b.history());
    }
  }
}

// Batched decode on CUDA (Decoder::step_batch: the *_rows overrides, tables inline in the launch
// arguments, one graph per batch shape): 5 sequences with different histories (prompts of 3, 17, 40, 1
// and 70 tokens: the last crosses an attention split boundary) stepped together for 6 tokens equal each
// sequence stepped alone. With fp32 activations (Options::exact) only the summation order differs: max
// |dlogit| <= 0.1% of the logit scale (a row reading another row's state or position is off by the whole
// scale); with q16 activations digit rounding flips cascade as in walk vs chunk: <= 0.1% (measured
// 0.009%). Graphs on and off agree bit for bit.
TEST(CudaModel, BatchedStepMatchesEachSequenceAlone) {
  BONSAI_REQUIRE_GPU();
  const std::string path = tiny_pack_path();
  if (path.empty() || !std::filesystem::exists(path)) GTEST_SKIP() << "no tiny pack (set BONSAI_TINY_PACK)";
  const Model m = load_model(path);
  const int64_t V = m.head.rows;
  const std::vector<int64_t> lens = {3, 17, 40, 1, 70};
  const int64_t B = int64_t(lens.size()), steps = 6;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : lens) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = int32_t(rng() % uint32_t(V));
    prompts.push_back(p);
  }
  std::vector<int32_t> next(static_cast<size_t>(B * steps));
  for (auto& t : next) t = int32_t(rng() % uint32_t(V));

  // logits [steps, B, V] of the batched run (graphs on / off) and of each sequence alone
  auto run = [&](bool batched, bool graphs, bool exact, int pairs) {
    CudaBackend::Options o;
    o.graphs = graphs;
    o.exact = exact;
    o.attn_pairs = pairs;
    CudaBackend be(o);
    Decoder dec(m, be);
    std::vector<DecoderState> st;
    for (int64_t b = 0; b < B; ++b) {
      st.push_back(dec.new_state(128));
      for (size_t p = 0; p < prompts[size_t(b)].size(); p += 64) {
        const int64_t n = std::min<int64_t>(64, int64_t(prompts[size_t(b)].size() - p));
        dec.forward(st.back(), prompts[size_t(b)].data() + p, n, LogitsMode::None, nullptr);
      }
    }
    std::vector<float> out(static_cast<size_t>(steps * B * V));
    for (int64_t s = 0; s < steps; ++s) {
      float* ls = out.data() + s * B * V;
      if (batched) {
        std::vector<DecoderState*> ptrs;
        for (auto& x : st) ptrs.push_back(&x);
        dec.step_batch(ptrs.data(), next.data() + s * B, B, ls);
      } else {
        for (int64_t b = 0; b < B; ++b) dec.forward(st[size_t(b)], &next[size_t(s * B + b)], 1, LogitsMode::Last, ls + b * V);
      }
    }
    return out;
  };
  // both decode-attention loops (Options::attn_pairs 1 and 2: one or two key positions per warp step)
  for (const int pairs : {1, 2})
  for (const bool exact : {true, false}) {
    const auto alone = run(false, true, exact, pairs), batch = run(true, true, exact, pairs),
               batch_eager = run(true, false, exact, pairs);
    EXPECT_EQ(batch, batch_eager);
    // a NaN would slip through the max |dlogit| below (std::max drops it)
    EXPECT_TRUE(std::all_of(alone.begin(), alone.end(), [](float x) { return std::isfinite(x); })) << "pairs " << pairs;
    EXPECT_TRUE(std::all_of(batch.begin(), batch.end(), [](float x) { return std::isfinite(x); })) << "pairs " << pairs;
    double scale = 0, worst = 0;
    int argmax_same = 0;
    for (int64_t r = 0; r < steps * B; ++r) {
      const float* a = alone.data() + r * V;
      const float* b = batch.data() + r * V;
      for (int64_t v = 0; v < V; ++v) {
        scale = std::max(scale, std::fabs(double(a[v])));
        worst = std::max(worst, std::fabs(double(a[v]) - double(b[v])));
      }
      argmax_same += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    }
    std::printf("[tiny batched vs alone, %s, attention pairs %d] B %lld x %lld steps: max|dlogit| %.6f (%.4f%% of %.2f), argmax %d/%lld\n",
                exact ? "exact" : "q16", pairs, (long long)B, (long long)steps, worst, 100.0 * worst / scale, scale,
                argmax_same, (long long)(steps * B));
    // exact (fp32 activations): summation order only; q16: rounding flips cascade as in walk vs chunk
    EXPECT_LE(worst, (exact ? 1e-3 : 0.001) * scale) << (exact ? "exact" : "q16");
  }
  // Greedy batched steps pick each row's argmax on the device (Backend::argmax_rows): the same tokens as
  // the argmax of the logits step_batch returns.
  {
    CudaBackend be;
    Decoder dec(m, be);
    std::vector<DecoderState> a, b;
    for (int64_t r = 0; r < B; ++r) {
      a.push_back(dec.new_state(128));
      b.push_back(dec.new_state(128));
      dec.forward(a.back(), prompts[size_t(r)].data(), std::min<int64_t>(64, lens[size_t(r)]), LogitsMode::None, nullptr);
      dec.forward(b.back(), prompts[size_t(r)].data(), std::min<int64_t>(64, lens[size_t(r)]), LogitsMode::None, nullptr);
    }
    std::vector<DecoderState*> pa, pb;
    for (int64_t r = 0; r < B; ++r) pa.push_back(&a[size_t(r)]), pb.push_back(&b[size_t(r)]);
    std::vector<float> logits(static_cast<size_t>(B * V));
    std::vector<int32_t> next(static_cast<size_t>(B));
    for (int64_t s = 0; s < steps; ++s) {
      dec.step_batch(pa.data(), next.data(), B, logits.data());
      std::vector<int32_t> want(static_cast<size_t>(B));
      for (int64_t r = 0; r < B; ++r)
        want[size_t(r)] = int32_t(std::max_element(logits.begin() + r * V, logits.begin() + (r + 1) * V) - (logits.begin() + r * V));
      std::vector<int32_t> got(static_cast<size_t>(B));
      dec.step_batch_argmax(pb.data(), next.data(), B, got.data());
      EXPECT_EQ(got, want) << "step " << s;
      next = got;
    }
  }
}

// The fixture gate (`bonsai gate --backend cuda` on the committed HF fixture) with the q16 default, chunked
// prefill (64, 16) and the token walk (matvec only): 100% argmax outside the 1e-3 tie band, max |dlogit|
// <= 5e-3, mean KL <= 1e-7 (measured on the H200, round 19, with the prefill's row units: 726/726, 2.28e-3, 6.66e-8;
// chunk 64 2.20e-3, 6.49e-8; walk 2.29e-3, 4.35e-8; per-group units 2.07e-3, 4.30e-8). GEMM v4's fp16 activations
// (--act f16) are held to their looser stated bound; the q8 form is run too and only reported (it fails: 687/726, 0.658).
// The seed-7 tiny pack: $BONSAI_TINY7_PACK, else written by the bonsai binary of this build; the fixture:
// $BONSAI_GATE_FIXTURE, else tests/data/fixtures/tiny_seed7.safetensors.
TEST(CudaModel, Q16PassesTheFixtureGate) {
  BONSAI_REQUIRE_GPU();
  std::string fixture = std::string(BONSAI_TEST_DATA) + "/fixtures/tiny_seed7.safetensors";
  if (const char* f = std::getenv("BONSAI_GATE_FIXTURE")) fixture = f;
  if (!std::filesystem::exists(fixture)) GTEST_SKIP() << fixture << " is not there";
  std::string pack;
  if (const char* p = std::getenv("BONSAI_TINY7_PACK")) pack = p;
#ifdef BONSAI_BINARY
  if (pack.empty()) {
    const std::string dir = ::testing::TempDir() + "/bonsai_cuda_tiny7_" + std::to_string(::getpid());
    const std::string cmd = std::string(BONSAI_BINARY) + " make-pack --preset tiny --seed 7 --format gguf-pq2_0 -o " +
                            dir + " > /dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) pack = dir + "/tiny-pq2_0.gguf";
  }
#endif
  if (pack.empty() || !std::filesystem::exists(pack)) GTEST_SKIP() << "no seed-7 tiny pack (set BONSAI_TINY7_PACK)";
  const GateFixture fx = read_gate_fixture(fixture);
  const Model m = load_model(pack);
  struct Mode {
    const char* name;
    int levels, f16;          // Options::act_levels, Options::gemm_f16
    double max_delta, max_kl;  // the bound it is held to (0: reported only)
    int chunk = 2048;          // Options::prefill_chunk (the default: every prompt one chunk; 64: the long one in 6)
    bool row_units = true;     // Options::row_units (round 19, the default): the prefill sites' one unit per row
  } modes[] = {{"q16", 2, 0, 5e-3, 1e-7},
               {"q16 chunk 64", 2, 0, 5e-3, 1e-7, 64},
               {"q16 group units", 2, 0, 5e-3, 1e-7, 2048, false},  // one unit per 128-group (round 18's default)
               // GEMM v4 on every product of >= 3 rows (the 64 / 16 chunks here): the stated looser
               // bound of fp16 activations (H200, round 13: 726/726, 0.0164, 2.5e-6 through `bonsai gate`)
               {"f16", 2, 3, 0.03, 5e-6},
               {"q8", 1, 0, 0, 0}};
  for (const Mode& md : modes) {
    GateOptions bounds;
    bounds.max_delta = md.max_delta > 0 ? md.max_delta : 1.0;
    bounds.max_kl = md.max_kl > 0 ? md.max_kl : 1.0;
    CudaBackend::Options o;
    o.act_levels = md.levels;
    o.gemm_f16 = md.f16;
    o.gemm_f16_all = md.f16 > 0;  // the tiny pack's products are all small
    o.prefill_chunk = md.chunk;
    o.row_units = md.row_units;
    CudaBackend be(o);
    ASSERT_EQ(be.prefill_chunk(), md.chunk);
    Decoder dec(m, be);
    for (const bool walk : {false, true}) {
      if (walk && (md.f16 || md.chunk != 2048 || !md.row_units)) continue;  // the walk is all M = 1 matvecs: q16's
      SessionOptions so;
      if (walk) so.chunks = {};
      const GateReport r = run_gate(dec, fx, bounds, so);
      const GateStats& t = r.overall;
      std::printf("[gate %s %s] agree %lld/%lld counted of %lld, max|dlogit| %.3g, mean KL %.3g -> %s\n", md.name,
                  walk ? "walk" : "chunks", (long long)t.agree, (long long)t.counted, (long long)t.positions,
                  t.max_delta, t.mean_kl(), r.pass() ? "pass" : "FAIL");
      if (md.max_delta > 0) {
        EXPECT_TRUE(r.pass()) << md.name << (walk ? " walk" : " chunks");
        EXPECT_GE(t.counted, t.positions - 5);
      }
    }
  }
}

}  // namespace
}  // namespace bonsai
