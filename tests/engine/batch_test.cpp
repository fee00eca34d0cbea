// Batched decode (Decoder::step_batch, BatchGenerator) on the tiny pack, ref and cpu backends.
//
// What could go wrong and what catches it: a row reading another row's KV cache, conv or recurrent state,
// or another row's position (RoPE, causal limit). Every test batches sequences with DIFFERENT histories
// (different prompts and lengths, so different positions and states): any mix-up changes a row's logits
// by far more than the tolerances below.
//
// Tolerances (the numbers in brackets were measured on the 2-core dev VM, AVX-512 kernels):
//   B = 1 step_batch vs forward(M = 1):            bit-identical on ref and cpu (same ops, same order).
//   a row of a B-row step vs that sequence stepped alone: the linears run at M = B vs M = 1, so only the
//   float summation order may differ: ref (fp64 accumulation) bit-identical [0]; cpu: cpu_max_delta()
//   (cpu_bounds.h: 1e-3 at f32 / q24 [2.1e-5], 5e-3 at the q16 default [1.35e-3]), argmax equal. cuda (CUDA
//   builds with a device; exact mode): 1e-3 [3.8e-6 on an H200], B = 1 included.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "backend/ref/ref_backend.h"
#include "engine/batch.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "cpu_bounds.h"
#include "engine_test_util.h"
#include "util/error.h"
#ifdef BONSAI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

using namespace bonsai;
using namespace bonsai::testing_support;
using ::testing::HasSubstr;

namespace {


// "ref", "cpu" or (CUDA builds) "cuda"; nullptr when that backend has no device here (the test skips).
// CUDA runs its exact mode (fp32 activations): the int8 fast path rounds rows differently at M = B and
// M = 1 (the activation scale is per row, but its kernels differ), which the CUDA tests measure themselves.
std::unique_ptr<Backend> backend_named(const std::string& name) {
  if (name == "ref") return std::make_unique<RefBackend>();
#ifdef BONSAI_HAVE_CUDA
  if (name == "cuda") {
    if (cuda_device_count() == 0) return nullptr;
    CudaBackend::Options o;
    o.exact = true;
    return std::make_unique<CudaBackend>(o);
  }
#endif
  return std::make_unique<CpuBackend>();
}

std::vector<std::string> backends_to_test() {
#ifdef BONSAI_HAVE_CUDA
  return {"ref", "cpu", "cuda"};
#else
  return {"ref", "cpu"};
#endif
}

// max |a - b| over two rows of the same size.
double max_abs_diff(const float* a, const float* b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

// Tolerance for one row of a batch vs the same sequence alone: summation order only (see the top).
// (The CPU's q16 default: a digit rounding that flips between the two orders, cpu_bounds.h.)
double row_tolerance(const std::string& backend) {
  return backend == "ref" ? 0.0 : backend == "cpu" ? cpu_max_delta() : 1e-3;
}

// Prefills a fresh state with `prompt` (chunked, as a Session would) and returns it.
DecoderState prefilled(Decoder& dec, const std::vector<int32_t>& prompt, int64_t capacity) {
  DecoderState s = dec.new_state(capacity);
  std::vector<float> logits(size_t(dec.vocab()));
  for (const int64_t m : plan_prefill(int64_t(prompt.size()), std::vector<int64_t>{64, 16}))
    dec.forward(s, prompt.data() + s.pos, m, LogitsMode::Last, logits.data());
  return s;
}

class BatchDecode : public ::testing::TestWithParam<std::string> {};

}  // namespace

// B = 1 is the single-sequence decode step: the same ops in the same order, so the same bits (on ref and
// cpu, whose *_rows ops are the defaults; cuda's own one-launch *_rows kernels: within the row tolerance).
TEST_P(BatchDecode, OneRowEqualsTheSingleSequenceStep) {
  auto be = backend_named(GetParam());
  if (!be) GTEST_SKIP() << "no CUDA device";
  Decoder dec(tiny_model("pq2"), *be);
  const int64_t V = dec.vocab();
  const auto prompt = test_tokens(23, V, 31), next = test_tokens(5, V, 32);
  DecoderState a = prefilled(dec, prompt, 40), b = prefilled(dec, prompt, 40);
  std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
  for (int32_t t : next) {
    dec.forward(a, &t, 1, LogitsMode::Last, la.data());
    DecoderState* row = &b;
    dec.step_batch(&row, &t, 1, lb.data());
    if (GetParam() == "cuda") EXPECT_LE(max_abs_diff(la.data(), lb.data(), la.size()), row_tolerance("cuda"));
    else EXPECT_EQ(la, lb);
  }
  EXPECT_EQ(a.pos, b.pos);
  EXPECT_EQ(dec.state_bytes(40), a.bytes());
  if (GetParam() != "cuda") EXPECT_EQ(host_copy(*be, a.layers[0].recurrent), host_copy(*be, b.layers[0].recurrent));
}

// Five sequences with different prompts and lengths (positions 1 .. 70, so different RoPE positions,
// causal limits, KV contents and recurrent states) stepped together equal each stepped alone.
TEST_P(BatchDecode, RowsEqualEachSequenceSteppedAlone) {
  const std::string name = GetParam();
  auto be = backend_named(name);
  if (!be) GTEST_SKIP() << "no CUDA device";
  Decoder dec(tiny_model("pq2"), *be);
  const int64_t V = dec.vocab(), steps = 6;
  const std::vector<int64_t> lengths{1, 7, 20, 33, 70};
  const int64_t B = int64_t(lengths.size());
  std::vector<DecoderState> alone, batched;
  std::vector<std::vector<int32_t>> feed;  // [B][steps] teacher-forced inputs, different per row
  for (int64_t b = 0; b < B; ++b) {
    const auto prompt = test_tokens(lengths[size_t(b)], V, 100 + uint32_t(b));
    alone.push_back(prefilled(dec, prompt, 80));
    batched.push_back(prefilled(dec, prompt, 80));
    feed.push_back(test_tokens(steps, V, 200 + uint32_t(b)));
  }
  std::vector<DecoderState*> rows;
  for (auto& s : batched) rows.push_back(&s);
  std::vector<float> lb(static_cast<size_t>(B * V)), la(static_cast<size_t>(V));
  double worst = 0;
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<int32_t> ids;
    for (int64_t b = 0; b < B; ++b) ids.push_back(feed[size_t(b)][size_t(t)]);
    dec.step_batch(rows.data(), ids.data(), B, lb.data());
    for (int64_t b = 0; b < B; ++b) {
      dec.forward(alone[size_t(b)], &ids[size_t(b)], 1, LogitsMode::Last, la.data());
      const float* row = lb.data() + b * V;
      const double d = max_abs_diff(row, la.data(), size_t(V));
      worst = std::max(worst, d);
      EXPECT_LE(d, row_tolerance(name)) << "step " << t << " row " << b;
      EXPECT_EQ(greedy_argmax({row, size_t(V)}), greedy_argmax(la)) << "step " << t << " row " << b;
    }
  }
  std::printf("    %s: %lld rows x %lld steps, batch vs alone max|dlogit| %.3g\n", name.c_str(), (long long)B,
              (long long)steps, worst);
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(batched[size_t(b)].pos, lengths[size_t(b)] + steps);
  // The states themselves (conv + recurrent of a GDN layer, the KV cache of the attention layer).
  for (int64_t b = 0; b < B; ++b)
    for (size_t l = 0; l < batched[size_t(b)].layers.size(); ++l) {
      const LayerState &x = batched[size_t(b)].layers[l], &y = alone[size_t(b)].layers[l];
      const Buffer& bx = x.recurrent ? x.recurrent : x.k;
      const Buffer& by = y.recurrent ? y.recurrent : y.k;
      EXPECT_LE(max_rel(host_copy(*be, bx), host_copy(*be, by)), name == "ref" ? 0.0 : 1e-4) << "row " << b << " layer " << l;
    }
}

// A batch whose membership changes (a row retired mid-way, the rest compacted, then the order reversed and
// a newcomer added) leaves every remaining sequence where stepping it alone would.
TEST_P(BatchDecode, RetiringAndReorderingRowsDoesNotChangeTheOthers) {
  const std::string name = GetParam();
  auto be = backend_named(name);
  if (!be) GTEST_SKIP() << "no CUDA device";
  Decoder dec(tiny_model("pq2"), *be);
  const int64_t V = dec.vocab();
  const std::vector<int64_t> lengths{9, 2, 17, 40, 5};
  std::vector<DecoderState> alone, batched;
  for (size_t b = 0; b < lengths.size(); ++b) {
    const auto prompt = test_tokens(lengths[b], V, 300 + uint32_t(b));
    alone.push_back(prefilled(dec, prompt, 64));
    batched.push_back(prefilled(dec, prompt, 64));
  }
  std::vector<float> lb(lengths.size() * size_t(V)), la(static_cast<size_t>(V));
  uint32_t seed = 400;
  auto step = [&](const std::vector<size_t>& members) {
    std::vector<DecoderState*> rows;
    for (size_t b : members) rows.push_back(&batched[b]);
    const auto ids = test_tokens(int64_t(members.size()), V, seed++);
    dec.step_batch(rows.data(), ids.data(), int64_t(rows.size()), lb.data());
    for (size_t r = 0; r < members.size(); ++r) {
      dec.forward(alone[members[r]], &ids[r], 1, LogitsMode::Last, la.data());
      EXPECT_LE(max_abs_diff(lb.data() + r * size_t(V), la.data(), size_t(V)), row_tolerance(name))
          << "sequence " << members[r] << " at row " << r;
    }
  };
  for (int i = 0; i < 3; ++i) step({0, 1, 2, 3});
  for (int i = 0; i < 3; ++i) step({0, 2, 3});     // sequence 1 retired; the rest compacted
  for (int i = 0; i < 3; ++i) step({3, 4, 2, 0});  // reordered; sequence 4 admitted
  EXPECT_EQ(batched[1].pos, lengths[1] + 3);       // the retired one was not touched after it left
  EXPECT_EQ(batched[0].pos, lengths[0] + 9);
  EXPECT_EQ(batched[4].pos, lengths[4] + 3);
}

// The greedy step returns each row's argmax of exactly the logits step_batch would return.
TEST_P(BatchDecode, ArgmaxStepPicksTheArgmaxOfEachRow) {
  auto be = backend_named(GetParam());
  if (!be) GTEST_SKIP() << "no CUDA device";
  Decoder dec(tiny_model("pq2"), *be);
  const int64_t V = dec.vocab();
  const std::vector<int64_t> lengths{3, 18, 1, 50};
  const int64_t B = int64_t(lengths.size());
  std::vector<DecoderState> x, y;
  for (int64_t b = 0; b < B; ++b) {
    const auto prompt = test_tokens(lengths[size_t(b)], V, 700 + uint32_t(b));
    x.push_back(prefilled(dec, prompt, 64));
    y.push_back(prefilled(dec, prompt, 64));
  }
  std::vector<DecoderState*> rx, ry;
  for (int64_t b = 0; b < B; ++b) {
    rx.push_back(&x[size_t(b)]);
    ry.push_back(&y[size_t(b)]);
  }
  std::vector<float> logits(static_cast<size_t>(B * V));
  std::vector<int32_t> next(static_cast<size_t>(B));
  for (int t = 0; t < 3; ++t) {
    const auto ids = test_tokens(B, V, 800 + uint32_t(t));
    dec.step_batch(rx.data(), ids.data(), B, logits.data());
    dec.step_batch_argmax(ry.data(), ids.data(), B, next.data());
    for (int64_t b = 0; b < B; ++b)
      EXPECT_EQ(next[size_t(b)], greedy_argmax({logits.data() + b * V, size_t(V)})) << "step " << t << " row " << b;
  }
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(y[size_t(b)].pos, lengths[size_t(b)] + 3);
  EXPECT_THAT(error_of([&] { dec.step_batch_argmax(ry.data(), next.data(), B, nullptr); }), HasSubstr("null"));
}

// Greedy BatchGenerator == generate() on each request alone, token for token: 6 requests, at most 4 live
// (so two are admitted between steps as others retire), different prompts, lengths and -n, one that ends
// on a stop id, one with -n 1 (done at its prefill) and one with -n 0.
TEST_P(BatchDecode, GreedyBatchGenerationEqualsSequentialGeneration) {
  auto be = backend_named(GetParam());
  if (!be) GTEST_SKIP() << "no CUDA device";
  Decoder dec(tiny_model("pq2"), *be);
  const int64_t V = dec.vocab();
  struct Req {
    std::vector<int32_t> prompt;
    GenerateOptions opt;
  };
  std::vector<Req> reqs;
  const std::vector<int64_t> lengths{12, 1, 45, 7, 30, 3}, max_new{10, 14, 6, 1, 9, 0};
  for (size_t i = 0; i < lengths.size(); ++i) {
    Req r;
    r.prompt = test_tokens(lengths[i], V, 500 + uint32_t(i));
    r.opt.max_new_tokens = max_new[i];
    // Request 4 is greedy with a repetition penalty: while it is live the steps bring the logits back and
    // sample every row on the host; otherwise they ask only for the argmaxes (step_batch_argmax).
    if (i == 4) r.opt.sampling.repeat_penalty = 1.3f;
    reqs.push_back(r);
  }
  std::vector<GenerateResult> seq;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i == 2) {  // request 2 stops on its own 4th token (kept in the output, like generate())
      Session probe(dec);
      reqs[i].opt.stop_ids = {generate(probe, reqs[i].prompt, reqs[i].opt).tokens.at(3)};
    }
    Session s(dec);
    seq.push_back(generate(s, reqs[i].prompt, reqs[i].opt));
  }
  ASSERT_TRUE(seq[2].stopped);
  ASSERT_LE(seq[2].tokens.size(), 4u);

  BatchOptions bo;
  bo.max_batch = 4;
  BatchGenerator gen(dec, bo);
  std::vector<std::vector<int32_t>> streamed(reqs.size());
  gen.on_token = [&](int64_t id, int32_t t) { streamed[size_t(id)].push_back(t); };
  for (const Req& r : reqs) gen.submit(r.prompt, r.opt);
  int64_t steps = 0;
  while (gen.step()) {
    EXPECT_LE(gen.live(), 4);
    const std::vector<int64_t> rows = gen.live_ids();  // admission order = id order here, kept on retirement
    EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
    ++steps;
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(gen.done(int64_t(i)));
    EXPECT_EQ(gen.result(int64_t(i)).tokens, seq[i].tokens) << "request " << i;
    EXPECT_EQ(gen.result(int64_t(i)).stopped, seq[i].stopped) << "request " << i;
    EXPECT_EQ(streamed[i], seq[i].tokens) << "request " << i;
  }
  const BatchStats& st = gen.stats();
  int64_t total = 0;
  for (const auto& r : seq) total += int64_t(r.tokens.size());
  EXPECT_EQ(st.admitted, 6);
  EXPECT_EQ(st.max_live, 4);
  // Every token but each request's first (from its prefill) came from a batched step.
  EXPECT_EQ(st.decode_tokens, total - 5);  // request 5 (-n 0) has no first token
  EXPECT_LT(st.decode_steps, st.decode_tokens);  // rows really were stepped together
  EXPECT_FALSE(gen.step());
}

// Seeded sampling too: each row has its own sampler, so the draws are those of generate() alone (on ref
// the batched logits are bit-identical, so every draw must be).
TEST(BatchDecodeRef, SeededSamplingEqualsSequentialSampling) {
  RefBackend rb;
  Decoder dec(tiny_model("pq2"), rb);
  const int64_t V = dec.vocab();
  BatchGenerator gen(dec);
  std::vector<GenerateResult> seq;
  // Rows 0-2: top-k sampling with a penalty (the backend's top-k route, per row); row 3 greedy (its row's
  // argmax inside a mixed step); row 4 top-k off with top-p (its row copied to the host).
  for (uint32_t i = 0; i < 5; ++i) {
    GenerateOptions o;
    o.max_new_tokens = 8;
    o.sampling.temperature = i == 3 ? 0.0f : 0.9f;
    o.sampling.top_k = i == 4 ? 0 : 40;
    o.sampling.top_p = i == 4 ? 0.9f : 1.0f;
    o.sampling.repeat_penalty = i == 3 ? 1.0f : 1.1f;
    o.sampling.seed = 77 + i;
    const auto prompt = test_tokens(5 + 9 * i, V, 600 + i);
    Session s(dec);
    seq.push_back(generate(s, prompt, o));
    gen.submit(prompt, o);
  }
  gen.run();
  for (size_t i = 0; i < seq.size(); ++i) EXPECT_EQ(gen.result(int64_t(i)).tokens, seq[i].tokens) << "request " << i;
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchDecode, ::testing::ValuesIn(backends_to_test()),
                         [](const auto& info) { return std::string(info.param); });

TEST(BatchDecodeErrors, BadStepsAreRefusedBeforeAnythingRuns) {
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb, 8);
  const int64_t V = dec.vocab();
  DecoderState a = dec.new_state(4), b = dec.new_state(2);
  std::vector<float> logits(static_cast<size_t>(8 * V));
  DecoderState* two[2] = {&a, &b};
  const int32_t ok[2] = {1, 2};
  EXPECT_THAT(error_of([&] { dec.step_batch(two, ok, 0, logits.data()); }), HasSubstr("batch of 0 sequences (1..8"));
  std::vector<DecoderState*> nine(9, &a);
  const std::vector<int32_t> ids9(9, 1);
  EXPECT_THAT(error_of([&] { dec.step_batch(nine.data(), ids9.data(), 9, logits.data()); }),
              HasSubstr("batch of 9 sequences (1..8"));
  const int32_t bad[2] = {1, int32_t(V)};
  EXPECT_THAT(error_of([&] { dec.step_batch(two, bad, 2, logits.data()); }),
              HasSubstr("sequence 1's token id " + std::to_string(V) + " is outside the vocabulary"));
  const int32_t neg[2] = {-3, 1};
  EXPECT_THAT(error_of([&] { dec.step_batch(two, neg, 2, logits.data()); }), HasSubstr("token id -3"));
  DecoderState* same[2] = {&a, &a};
  EXPECT_THAT(error_of([&] { dec.step_batch(same, ok, 2, logits.data()); }),
              HasSubstr("sequences 0 and 1 are the same state"));
  DecoderState* with_null[2] = {&a, nullptr};
  EXPECT_THAT(error_of([&] { dec.step_batch(with_null, ok, 2, logits.data()); }), HasSubstr("sequence 1 of the batch has no state"));
  DecoderState foreign;  // no layers: not a state of this model
  DecoderState* with_foreign[2] = {&a, &foreign};
  EXPECT_THAT(error_of([&] { dec.step_batch(with_foreign, ok, 2, logits.data()); }), HasSubstr("made for another model"));
  EXPECT_THAT(error_of([&] { dec.step_batch(two, ok, 2, nullptr); }), HasSubstr("null"));
  EXPECT_EQ(a.pos, 0);  // nothing ran
  EXPECT_EQ(b.pos, 0);
  dec.step_batch(two, ok, 2, logits.data());
  dec.step_batch(two, ok, 2, logits.data());
  EXPECT_EQ(b.pos, 2);  // b is now full
  EXPECT_THAT(error_of([&] { dec.step_batch(two, ok, 2, logits.data()); }),
              HasSubstr("sequence 1 is full (2 of 2 positions used)"));
  EXPECT_EQ(a.pos, 2);  // the refused step did not advance the other row either
}

TEST(BatchDecodeErrors, BadRequestsAreRefusedWhenSubmitted) {
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb, 8);
  const int64_t V = dec.vocab();
  BatchOptions bad_b;
  bad_b.max_batch = 0;
  EXPECT_THAT(error_of([&] { BatchGenerator g(dec, bad_b); }), HasSubstr("(1..8), got 0"));
  bad_b.max_batch = 9;
  EXPECT_THAT(error_of([&] { BatchGenerator g(dec, bad_b); }), HasSubstr("(1..8), got 9"));
  BatchOptions bo;
  bo.max_batch = 8;
  bo.capacity = 16;
  bo.chunks = {9};
  EXPECT_THAT(error_of([&] { BatchGenerator g(dec, bo); }), HasSubstr("prefill chunk of 9 tokens: chunks must be in [1, 8]"));
  bo.chunks = {8};
  BatchGenerator gen(dec, bo);
  GenerateOptions o;
  o.max_new_tokens = 4;
  EXPECT_THAT(error_of([&] { gen.submit({}, o); }), HasSubstr("the prompt is empty"));
  const std::vector<int32_t> out_of_vocab{1, int32_t(V) + 5};
  EXPECT_THAT(error_of([&] { gen.submit(out_of_vocab, o); }), HasSubstr("prompt token 1 is id " + std::to_string(V + 5)));
  const std::vector<int32_t> long_prompt(13, 1);
  EXPECT_THAT(error_of([&] { gen.submit(long_prompt, o); }), HasSubstr("needs 17 positions, past the KV capacity of 16"));
  GenerateOptions neg = o;
  neg.max_new_tokens = -1;
  EXPECT_THAT(error_of([&] { gen.submit(std::vector<int32_t>{1}, neg); }), HasSubstr("-n must be >= 0"));
  GenerateOptions badp = o;
  badp.sampling.top_p = 2;
  EXPECT_THAT(error_of([&] { gen.submit(std::vector<int32_t>{1}, badp); }), HasSubstr("--top-p"));
  EXPECT_EQ(gen.queued(), 0);  // nothing was queued
  EXPECT_FALSE(gen.step());
  EXPECT_THAT(error_of([&] { (void)gen.result(0); }), HasSubstr("no request 0"));
}
