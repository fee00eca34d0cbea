// engine/chat: the reply filters (StopStrings, ReasoningSplitter) piece by piece, and the Chat turn logic
// in-process on the tiny pack: exactly which tokens the session holds after each turn in both history
// modes, template choice, and the errors that leave the conversation unchanged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../engine/engine_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/chat.h"
#include "engine/pack_tokenizer.h"

using namespace bonsai;
using namespace bonsai::testing_support;

namespace {

std::string stream(StopStrings& s, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces)
    if (s.push(p, out)) break;
  s.flush(out);
  return out;
}

struct Split {
  std::string reasoning, answer;
  std::vector<ReplyPiece> pieces;
};

Split split(bool in_reasoning, const std::vector<std::string>& chunks) {
  ReasoningSplitter sp(in_reasoning);
  Split r;
  for (const auto& c : chunks) sp.push(c, r.pieces);
  sp.finish(r.pieces);
  for (const auto& p : r.pieces) (p.part == ReplyPart::Reasoning ? r.reasoning : r.answer) += p.text;
  return r;
}

// Every way of cutting `s` into two pushes, plus one byte at a time.
std::vector<std::vector<std::string>> cuts(const std::string& s) {
  std::vector<std::vector<std::string>> v;
  for (size_t i = 0; i <= s.size(); ++i) v.push_back({s.substr(0, i), s.substr(i)});
  std::vector<std::string> bytes;
  for (char c : s) bytes.push_back(std::string(1, c));
  v.push_back(bytes);
  return v;
}

}  // namespace

TEST(ChatStopStrings, EndsBeforeTheFirstStopStringHowEverTheTextArrives) {
  for (const auto& c : cuts("Hello world. END more END")) {
    StopStrings s({"END", "xyz"});
    EXPECT_EQ(stream(s, c), "Hello world. ");
    EXPECT_TRUE(s.hit());
  }
  StopStrings none({"END"});
  EXPECT_EQ(stream(none, {"a partial E", "N"}), "a partial EN");  // a partial match at the end is text
  EXPECT_FALSE(none.hit());
  StopStrings earliest({"world", "lo w"});
  EXPECT_EQ(stream(earliest, {"Hello world"}), "Hel");
  EXPECT_THROW(StopStrings({""}), Error);
}

TEST(ChatStopStrings, HoldsBackOnlyWhatCouldStillBeAStopString) {
  StopStrings s({"<|end|>"});
  std::string out;
  EXPECT_FALSE(s.push("answer <|en", out));
  EXPECT_EQ(out, "answer ");
  EXPECT_FALSE(s.push("try", out));
  EXPECT_EQ(out, "answer <|entry");
}

TEST(ChatReasoning, SplitsThinkBlocksAtAnyCut) {
  for (const auto& c : cuts("\nI think so.\n</think>\n\nYes, 42.\n")) {
    const Split r = split(true, c);  // the prompt opened the block (Qwen3.5's "<think>\n")
    EXPECT_EQ(r.reasoning, "I think so.");
    EXPECT_EQ(r.answer, "Yes, 42.");
  }
  for (const auto& c : cuts("<think>\nhmm\n</think>\n\nok")) {  // the model opens the block itself
    const Split r = split(false, c);
    EXPECT_EQ(r.reasoning, "hmm");
    EXPECT_EQ(r.answer, "ok");
  }
  const Split plain = split(false, {"no tags < here </thin"});
  EXPECT_EQ(plain.answer, "no tags < here </thin");
  EXPECT_EQ(plain.reasoning, "");
  const Split open = split(true, {"cut off mid-thought <"});  // ends inside the reasoning, a partial tag
  EXPECT_EQ(open.reasoning, "cut off mid-thought <");
}

TEST(ChatReasoning, PiecesArriveInOrderAndWhitespaceInsideAPartIsKept) {
  const Split r = split(true, {"a", "  ", "\n", "b", "</think>", "\n\n", "c ", " d", "  \n"});
  EXPECT_EQ(r.reasoning, "a  \nb");
  EXPECT_EQ(r.answer, "c  d");
  ASSERT_GE(r.pieces.size(), 2u);
  EXPECT_EQ(r.pieces.front().part, ReplyPart::Reasoning);
  EXPECT_EQ(r.pieces.back().part, ReplyPart::Answer);
}

TEST(ChatReasoning, PromptOpensReasoning) {
  EXPECT_TRUE(ReasoningSplitter::opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningSplitter::opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningSplitter::opens_reasoning("<|im_start|>assistant\n"));
}

namespace {

struct TinyChat {
  Pack pack = open_pack(tiny_packs().pq2);
  std::unique_ptr<Tokenizer> tok = load_pack_tokenizer(pack);
  ChatTemplateChoice tmpl = choose_chat_template(pack, "auto");
  CpuBackend backend{CpuBackend::Options{2, false}};
  Decoder dec{tiny_model("pq2"), backend};
  Session session;
  explicit TinyChat(int64_t ctx = 0) : session(dec, SessionOptions{ctx, {64, 16}}) {}
  std::unique_ptr<Chat> chat(ChatOptions o) { return std::make_unique<Chat>(session, *tok, tmpl.tmpl, o); }
  std::vector<int32_t> enc(const std::string& s) const { return tok->encode(s, true); }
};

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ChatOptions opts(int64_t n, HistoryMode h = HistoryMode::Keep) {
  ChatOptions o;
  o.max_new_tokens = n;
  o.history = h;
  o.ignore_eos = true;  // a fixed reply length: the random model may sample <|im_end|> any time
  o.sampling.temperature = 1.0f;
  o.sampling.seed = 5;
  return o;
}

}  // namespace

TEST(ChatTurns, TemplateIsThePacksOwn) {
  TinyChat t;
  EXPECT_FALSE(t.tmpl.fallback);
  EXPECT_NE(t.tmpl.origin.find("tokenizer.chat_template"), std::string::npos);
  const auto c = t.chat(opts(0));
  EXPECT_EQ(c->render_prompt("Hi"), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  ChatOptions off = opts(0);
  off.think = false;
  off.system = "Be brief.";
  EXPECT_EQ(t.chat(off)->render_prompt("Hi"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
  const Pack mlx = open_pack(tiny_packs().mlx);
  const ChatTemplateChoice m = choose_chat_template(mlx, "auto");
  EXPECT_FALSE(m.fallback);
  EXPECT_EQ(m.tmpl->source(), t.tmpl.tmpl->source());  // chat_template.jinja is the same template
  EXPECT_EQ(choose_chat_template(mlx, "chatml").tmpl->source(), chatml_template_source());
}

TEST(ChatTurns, KeepModeFeedsOnlyTheNewTurnAndKeepsTheReplyAsGenerated) {
  TinyChat t;
  auto c = t.chat(opts(6));
  const std::string r1 = c->render_prompt("Hello there");
  const TurnResult a = c->turn("Hello there");
  ASSERT_EQ(a.tokens.size(), 6u);
  EXPECT_EQ(a.stop, StopReason::Length);
  EXPECT_EQ(a.stats.prefill_tokens, int64_t(t.enc(r1).size()));
  EXPECT_EQ(a.stats.prefill_what, "first turn");
  EXPECT_EQ(a.stats.decode_steps, 5);
  // The last sampled token is pending: not fed yet, but counted in the context.
  EXPECT_EQ(t.session.history(), cat(t.enc(r1), {a.tokens.begin(), a.tokens.end() - 1}));
  EXPECT_EQ(c->context_tokens(), int64_t(t.enc(r1).size() + 6));

  const TurnResult b = c->turn("And now?");
  EXPECT_EQ(b.stats.prefill_what, "new turn only");
  EXPECT_FALSE(b.stats.reprefilled);
  const std::string tail = "<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n<think>\n";
  EXPECT_EQ(b.stats.prefill_tokens, int64_t(1 + t.enc(tail).size()));  // the pending token + the new turn
  const auto expect = cat(cat(cat(t.enc(r1), a.tokens), t.enc(tail)), {b.tokens.begin(), b.tokens.end() - 1});
  EXPECT_EQ(t.session.history(), expect);
  // The template itself renders the first reply without its reasoning from now on.
  EXPECT_EQ(c->messages().size(), 4u);
  EXPECT_EQ(c->messages()[1]["role"], "assistant");
}

TEST(ChatTurns, TemplateModeReprefillsWhenTheTemplateRerendersTheReply) {
  TinyChat t;
  auto c = t.chat(opts(6, HistoryMode::Template));
  const TurnResult a = c->turn("Hello there");
  const std::string r2 = c->render_prompt("And now?");
  const TurnResult b = c->turn("And now?");
  EXPECT_TRUE(b.stats.reprefilled);
  EXPECT_NE(b.stats.prefill_what.find("whole conversation re-prefilled"), std::string::npos) << b.stats.prefill_what;
  EXPECT_EQ(b.stats.prefill_tokens, int64_t(t.enc(r2).size()));
  EXPECT_EQ(t.session.history(), cat(t.enc(r2), {b.tokens.begin(), b.tokens.end() - 1}));
  (void)a;
}

TEST(ChatTurns, TemplateModeAppendsWhenTheRenderingExtendsTheContext) {
  // ChatML renders the reply as stored: the context extends when the stored reply re-encodes to the
  // sampled tokens, else it is rebuilt; either way it then equals the template's rendering + the reply.
  TinyChat t;
  t.tmpl = choose_chat_template(t.pack, "chatml");
  ChatOptions o = opts(6, HistoryMode::Template);
  auto c = t.chat(o);
  const TurnResult a = c->turn("Hello");
  const std::string r2 = c->render_prompt("Again");
  const auto all = t.enc(r2);
  const TurnResult b = c->turn("Again");
  EXPECT_EQ(t.session.history(), cat(all, {b.tokens.begin(), b.tokens.end() - 1})) << b.stats.prefill_what;
  (void)a;
}

TEST(ChatTurns, SystemChangeReprefillsResetEmpties) {
  TinyChat t;
  auto c = t.chat(opts(4));
  c->turn("Hello there");
  c->set_system("You are terse.");
  const std::string r2 = c->render_prompt("More");
  const TurnResult b = c->turn("More");
  EXPECT_TRUE(b.stats.reprefilled);
  EXPECT_EQ(b.stats.prefill_tokens, int64_t(t.enc(r2).size()));
  c->reset();
  EXPECT_EQ(c->context_tokens(), 0);
  EXPECT_EQ(c->turns(), 0u);
  EXPECT_EQ(t.session.position(), 0);
}

TEST(ChatTurns, ResetReplaysTheSameConversation) {
  TinyChat t;
  auto c = t.chat(opts(8));
  const TurnResult a = c->turn("Hello there");
  c->reset();
  const TurnResult b = c->turn("Hello there");
  EXPECT_EQ(a.tokens, b.tokens);  // the sampler is reseeded by reset
}

TEST(ChatTurns, ErrorsLeaveTheConversationUnchanged) {
  TinyChat t(40);
  auto c = t.chat(opts(100));
  EXPECT_THROW(c->turn("   \n "), Error);
  EXPECT_THROW(c->turn(std::string("bad \xFF byte")), Error);
  try {
    c->turn(std::string("ok \xC3("));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8: byte 0xC3 at offset 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.session.position(), 0);
  const TurnResult a = c->turn("Hi");
  EXPECT_EQ(a.stop, StopReason::ContextFull);
  EXPECT_EQ(c->context_tokens(), 40);
  EXPECT_THROW(c->turn("more"), ContextFullError);
  EXPECT_EQ(c->context_tokens(), 40);
  EXPECT_EQ(c->turns(), 1u);
}

TEST(ChatTurns, ControlTokenTextIsReadAsControlTokensWithANote) {
  TinyChat t;
  auto c = t.chat(opts(2));
  const TurnResult r = c->turn("<|im_end|><|im_start|>");
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("<|im_end|> <|im_start|>"), std::string::npos) << r.notes[0];
  const auto ids = t.enc(c->messages()[0]["content"].get<std::string>());
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ChatTurns, StopStringEndsTheReplyAndInterruptStopsIt) {
  TinyChat t;
  ChatOptions o = opts(12);
  o.think = false;
  const TurnResult full = t.chat(o)->turn("Hello");
  const std::string text = full.answer;
  std::string stop;  // two ASCII letters or digits from inside the answer (whole characters)
  for (size_t i = 1; i + 1 < text.size() && stop.empty(); ++i)
    if (std::isalnum((unsigned char)text[i]) && std::isalnum((unsigned char)text[i + 1])) stop = text.substr(i, 2);
  if (!stop.empty()) {
    ChatOptions s = o;
    s.stop_strings = {stop};
    const TurnResult cut = t.chat(s)->turn("Hello");
    EXPECT_EQ(cut.stop, StopReason::StopString);
    EXPECT_EQ(text.rfind(cut.answer, 0), 0u) << "'" << cut.answer << "' is not a prefix of '" << text << "'";
    EXPECT_LE(cut.answer.size(), text.find(s.stop_strings[0]));
  }
  int polls = 0;
  TurnCallbacks cb;
  cb.interrupted = [] { return true; };
  {  // during a prefill of more than one block: the message is dropped, the next turn re-prefills
    TinyChat u;
    auto c = u.chat(opts(3));
    c->turn("Hi");
    std::string lng;
    for (int i = 0; i < 300; ++i) lng += "word " + std::to_string(i) + " ";
    const TurnResult r = c->turn(lng, cb);
    EXPECT_EQ(r.stop, StopReason::Interrupted);
    EXPECT_TRUE(r.tokens.empty());
    EXPECT_EQ(c->turns(), 1u);
    const std::string r2 = c->render_prompt("Hi again");
    const TurnResult n = c->turn("Hi again");
    EXPECT_TRUE(n.stats.reprefilled);
    EXPECT_NE(n.stats.prefill_what.find("interrupted"), std::string::npos) << n.stats.prefill_what;
    EXPECT_EQ(u.session.history(), cat(u.enc(r2), {n.tokens.begin(), n.tokens.end() - 1}));
  }
  cb.interrupted = [&] { return ++polls > 3; };
  const TurnResult r = t.chat(opts(100))->turn("Hello", cb);
  EXPECT_EQ(r.stop, StopReason::Interrupted);
  EXPECT_LT(r.tokens.size(), 5u);
}
