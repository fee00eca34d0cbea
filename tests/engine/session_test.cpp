// Session, prefill planner, generation limits and the multi-turn append.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "engine/batch.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "cpu_bounds.h"
#include "engine_test_util.h"
#include "sampler_cases.h"
#include "util/error.h"

using namespace bonsai;
using namespace bonsai::testing_support;
using ::testing::HasSubstr;

namespace {


std::vector<int64_t> ones(int n) { return std::vector<int64_t>(size_t(n), 1); }

}  // namespace

TEST(PrefillPlanner, LargestChunkThatFitsThenOneRaggedChunk) {
  const std::vector<int64_t> c{64, 16};
  // The spec's 125-token prompt (the Apple host walked the last 13 tokens; we take any chunk length).
  EXPECT_EQ(plan_prefill(125, c), std::vector<int64_t>({64, 16, 16, 16, 13}));
  EXPECT_EQ(plan_prefill(512, c), std::vector<int64_t>(8, 64));
  EXPECT_EQ(plan_prefill(1, c), ones(1));
  EXPECT_EQ(plan_prefill(2, c), std::vector<int64_t>({2}));
  EXPECT_EQ(plan_prefill(15, c), std::vector<int64_t>({15}));
  EXPECT_EQ(plan_prefill(16, c), std::vector<int64_t>({16}));
  EXPECT_EQ(plan_prefill(17, c), std::vector<int64_t>({16, 1}));
  EXPECT_EQ(plan_prefill(64, c), std::vector<int64_t>({64}));
  EXPECT_EQ(plan_prefill(65, c), std::vector<int64_t>({64, 1}));
  EXPECT_EQ(plan_prefill(200, c), std::vector<int64_t>({64, 64, 64, 8}));
  EXPECT_EQ(plan_prefill(5, {}), ones(5));  // no chunks: walk
  EXPECT_EQ(plan_prefill(40, std::vector<int64_t>{16}), std::vector<int64_t>({16, 16, 8}));
  EXPECT_TRUE(plan_prefill(0, c).empty());
}

TEST(PrefillPlanner, DefaultChunksFollowTheDecodersMaxChunk) {
  constexpr int64_t kMax = SessionOptions::kMaxChunk;
  EXPECT_EQ(resolve_chunks({kMax, 16}, 256, ""), std::vector<int64_t>({256, 16}));
  // The default (round 18): max_chunk only, so a prompt shorter than it is one forward, not 16-token ones.
  const std::vector<int64_t> def = resolve_chunks(SessionOptions{}.chunks, 256, "");
  EXPECT_EQ(def, std::vector<int64_t>({256}));
  EXPECT_EQ(plan_prefill(200, def), std::vector<int64_t>({200}));
  EXPECT_EQ(plan_prefill(300, def), std::vector<int64_t>({256, 44}));
  EXPECT_EQ(plan_prefill(512, def), std::vector<int64_t>({256, 256}));
  EXPECT_EQ(BatchOptions{}.chunks, SessionOptions{}.chunks);
  EXPECT_EQ(resolve_chunks({16, kMax}, 16, ""), std::vector<int64_t>({16}));  // sorted, duplicates removed
  EXPECT_EQ(resolve_chunks({}, 64, ""), std::vector<int64_t>{});                // walk
  EXPECT_THAT(error_of([] { resolve_chunks({kMax, 128}, 64, "batch: "); }),
              HasSubstr("batch: prefill chunk of 128 tokens: chunks must be in [1, 64]"));
  EXPECT_THAT(error_of([] { resolve_chunks({0}, 64, ""); }), HasSubstr("prefill chunk of 0 tokens"));
  // The decoder's default max_chunk is the backend's prefill chunk (the CPU's: 64).
  CpuBackend cb;
  EXPECT_EQ(cb.prefill_chunk(), 64);
  Decoder dec(tiny_model("pq2"), cb);
  EXPECT_EQ(dec.max_chunk(), 64);
  EXPECT_EQ(Decoder(tiny_model("pq2"), cb, 16).max_chunk(), 16);
  EXPECT_THAT(error_of([&] { Decoder bad(tiny_model("pq2"), cb, -3); }), HasSubstr("max_chunk must be >= 1"));
}

TEST(Session, AppendingASecondTurnEqualsPrefillingTheConcatenation) {
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  const auto t1 = test_tokens(70, dec.vocab(), 21), t2 = test_tokens(27, dec.vocab(), 22);
  std::vector<int32_t> both = t1;
  both.insert(both.end(), t2.begin(), t2.end());
  const size_t V = size_t(dec.vocab());

  Session s1(dec), s2(dec);
  s1.append(t1);
  const std::span<const float> l1 = s1.append(t2);
  const std::vector<float> last_two_turns(l1.begin(), l1.end());
  const std::span<const float> l2 = s2.append(both);
  const std::vector<float> last_concat(l2.begin(), l2.end());
  EXPECT_EQ(s1.history(), both);
  EXPECT_EQ(s2.history(), both);
  EXPECT_EQ(s1.position(), int64_t(both.size()));
  {
    const auto s = compare("two turns vs concatenation (last logits)", last_concat, last_two_turns, int64_t(V));
    EXPECT_LE(s.max_delta, cpu_max_delta());
    EXPECT_EQ(greedy_argmax(last_two_turns), greedy_argmax(last_concat));
  }
  // Every position of the second turn, teacher-forced.
  Session s3(dec), s4(dec);
  std::vector<float> all3(both.size() * V), all4(both.size() * V);
  s3.append_all(t1, all3.data());
  s3.append_all(t2, all3.data() + t1.size() * V);
  s4.append_all(both, all4.data());
  const auto s = compare("two turns vs concatenation (all positions)", all4, all3, int64_t(V));
  EXPECT_LE(s.max_delta, cpu_max_delta());
  EXPECT_LE(s.mean_kl(), 1e-7);
  EXPECT_EQ(s.agree, s.counted);
}

TEST(Session, NextTokenFromKeptLogitsEqualsSamplingTheLogits) {
  // Session::append_kept + next_token against append + Sampler::sample, same seeds: a 70-token prompt
  // (chunks 64 + 6), then 12 single tokens, for greedy (the decoder's argmax), greedy with a penalty and
  // top-k sampling with and without top-p / min-p / penalty (the backend's top-k: HostBackend::top_k on
  // the CPU), and top-k off (the host copy). Same tokens, positions and histories.
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  const auto prompt = test_tokens(70, dec.vocab(), 31);
  auto opts = [](float temp, int32_t top_k, float top_p, float min_p, float penalty) {
    return sampler_options(temp, top_k, top_p, min_p, penalty, 16, 99);
  };
  const std::vector<SamplerOptions> cases{opts(0, 0, 1, 0, 1),       opts(0, 0, 1, 0, 1.3f),   opts(1.5f, 1, 1, 0, 1.2f),
                                          opts(1.5f, 40, 1, 0, 1),    opts(2.0f, 40, 0.9f, 0, 1.3f),
                                          opts(1.0f, 7, 1, 0.05f, 1), opts(1.5f, 0, 0.95f, 0, 1.2f)};
  for (size_t c = 0; c < cases.size(); ++c) {
    Sampler sa(cases[c], dec.vocab()), sb(cases[c], dec.vocab());
    Session a(dec), b(dec);
    const std::span<const float> l0 = a.append(prompt);
    int32_t ta = sa.sample(l0, a.history());
    b.append_kept(prompt);
    int32_t tb = b.next_token(sb, b.history());
    std::set<int32_t> distinct;
    for (int step = 0; step < 12; ++step) {
      ASSERT_EQ(ta, tb) << "case " << c << " step " << step;
      ASSERT_EQ(a.position(), b.position());
      ASSERT_EQ(a.history(), b.history());
      distinct.insert(ta);
      const std::span<const float> la = a.append(std::span<const int32_t>(&ta, 1));  // before a.history()
      ta = sa.sample(la, a.history());
      b.append_kept(std::span<const int32_t>(&tb, 1));
      tb = b.next_token(sb, b.history());
    }
    if (cases[c].temperature > 0 && cases[c].top_k != 1) EXPECT_GT(distinct.size(), 1u) << "case " << c;
  }
  // Refused like append, before anything runs.
  Session b(dec);
  const std::vector<int32_t> bad{1, int32_t(dec.vocab())};
  EXPECT_THAT(error_of([&] { b.append_kept(bad); }), HasSubstr("outside the vocabulary"));
  EXPECT_EQ(b.position(), 0);
}

TEST(Sampler, PlainArgmaxIsGreedyOrTopOneWithoutPenalty) {
  const auto plain = [](float temperature, int32_t top_k, float penalty) {
    SamplerOptions o;
    o.temperature = temperature;
    o.top_k = top_k;
    o.repeat_penalty = penalty;
    return Sampler(o, 16).plain_argmax();
  };
  EXPECT_TRUE(plain(0.0f, 0, 1.0f));
  EXPECT_TRUE(plain(0.8f, 1, 1.0f));
  EXPECT_FALSE(plain(0.8f, 0, 1.0f));
  EXPECT_FALSE(plain(0.8f, 2, 1.0f));
  EXPECT_FALSE(plain(0.0f, 0, 1.1f));  // the penalty needs the logits
}

TEST(Session, ResetStartsOver) {
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  const auto t = test_tokens(20, dec.vocab(), 23);
  Session s(dec);
  s.append(t);
  s.append(t);
  EXPECT_EQ(s.position(), 40);
  s.reset();
  EXPECT_EQ(s.position(), 0);
  EXPECT_TRUE(s.history().empty());
  const std::span<const float> again = s.append(t);
  Session fresh(dec);
  const std::span<const float> want = fresh.append(t);
  EXPECT_EQ(std::memcmp(again.data(), want.data(), want.size() * 4), 0);
}

TEST(Session, DefaultCapacityAndLimits) {
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  const int64_t ctx = dec.model().config.context_length;  // 8192 in the tiny preset
  Session def(dec);
  EXPECT_EQ(def.capacity(), std::min<int64_t>(ctx, Session::kDefaultCapacity));

  SessionOptions o;
  o.capacity = ctx + 1;
  EXPECT_THAT(error_of([&] { Session s(dec, o); }), HasSubstr("exceeds the model's context length"));
  o.capacity = -3;
  EXPECT_THAT(error_of([&] { Session s(dec, o); }), HasSubstr("must be positive"));
  o.capacity = 16;
  o.chunks = {128};
  EXPECT_THAT(error_of([&] { Session s(dec, o); }), HasSubstr("chunks must be in [1, 64]"));

  // KV capacity below the prompt.
  o.chunks = {64, 16};
  Session small(dec, o);
  const auto p20 = test_tokens(20, dec.vocab(), 24);
  EXPECT_THAT(error_of([&] { small.append(p20); }), HasSubstr("does not fit the KV capacity of 16 positions"));
  EXPECT_EQ(small.position(), 0);
  // Token ids outside the vocabulary.
  std::vector<int32_t> bad{1, 2, int32_t(dec.vocab())};
  EXPECT_THAT(error_of([&] { small.append(bad); }), HasSubstr("outside the vocabulary"));
  bad[2] = -1;
  EXPECT_THAT(error_of([&] { small.append(bad); }), HasSubstr("is id -1, outside the vocabulary"));
  EXPECT_THAT(error_of([&] { small.append(std::vector<int32_t>{}); }), HasSubstr("empty"));
  // -n past the capacity: checked before anything runs.
  GenerateOptions g;
  g.max_new_tokens = 13;
  const auto p4 = test_tokens(4, dec.vocab(), 25);
  EXPECT_THAT(error_of([&] { generate(small, p4, g); }), HasSubstr("plus 13 more tokens needs 17 positions"));
  EXPECT_EQ(small.position(), 0);
  g.max_new_tokens = 12;
  const GenerateResult r = generate(small, p4, g);
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(small.position(), 15);  // the last sampled token is not fed
}

TEST(Session, PromptLongerThanTheContext) {
  // A model whose context is shorter than the default capacity: the session takes the context length,
  // and a longer prompt is refused naming the context.
  Model m = tiny_model("pq2");  // a copy
  m.config.context_length = 32;
  CpuBackend cb;
  Decoder dec(m, cb);
  Session s(dec);
  EXPECT_EQ(s.capacity(), 32);
  const auto p = test_tokens(33, dec.vocab(), 26);
  EXPECT_THAT(error_of([&] { s.append(p); }), HasSubstr("longer than the model's context length of 32"));
}

TEST(Generate, GreedyIsDeterministicAndStopsOnStopIds) {
  CpuBackend cb;
  Decoder dec(tiny_model("pq2"), cb);
  const auto p = test_tokens(9, dec.vocab(), 27);
  GenerateOptions g;
  g.max_new_tokens = 10;
  Session s1(dec), s2(dec);
  const GenerateResult a = generate(s1, p, g), b = generate(s2, p, g);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.tokens.size(), 10u);
  EXPECT_FALSE(a.stopped);
  EXPECT_EQ(a.stats.prompt_tokens, 9);
  EXPECT_EQ(a.stats.decode_steps, 9);
  EXPECT_GT(a.stats.decode_gb_s(), 0.0);
  EXPECT_EQ(a.stats.weight_bytes_per_step, dec.model().decode_weight_bytes());
  // Greedy tokens equal the argmax of a teacher-forced run over prompt + generated.
  std::vector<int32_t> seq = p;
  seq.insert(seq.end(), a.tokens.begin(), a.tokens.end() - 1);
  const auto all = run_steps(dec, seq, walk(seq.size()));
  const size_t V = size_t(dec.vocab());
  for (size_t i = 0; i < a.tokens.size(); ++i)
    EXPECT_EQ(a.tokens[i], greedy_argmax(std::span<const float>(all.data() + (p.size() - 1 + i) * V, V))) << i;
  // Stop on the 4th token's id: generation ends at its first occurrence, which is emitted.
  g.stop_ids = {a.tokens[3]};
  const auto first = std::find(a.tokens.begin(), a.tokens.end(), a.tokens[3]);
  Session s3(dec);
  const GenerateResult c = generate(s3, p, g);
  EXPECT_TRUE(c.stopped);
  EXPECT_EQ(c.tokens, std::vector<int32_t>(a.tokens.begin(), first + 1));
}
