// Chat: a conversation on one Session, rendered with a chat template, one turn at a time.
//
// A turn renders the whole conversation (system, earlier turns, the new user message) with the template
// (add_generation_prompt = true, enable_thinking), feeds the session only what it does not hold yet,
// then samples the reply token by token, streaming the decoded text through StopStrings and the
// ReasoningSplitter.
//
// What a turn prefills (the "delta"). The session cannot be rewound: the GDN layers carry a recurrent
// state, so the only way back is reset() + a prefill of everything from token 0. Templates may re-render
// earlier turns differently from how they were generated: Qwen3.5's template drops the reasoning (and the
// think block) of every assistant message before the last user query, so the text the session holds
// (the generation prompt "<|im_start|>assistant\n<think>\n" + the reasoning + the answer) is never a
// prefix of the next rendering. Two policies:
//
//  HistoryMode::Keep (default): the model's previous reply stays in the context exactly as it was
//    generated (reasoning included) and only the new turn is prefilled. The new turn's text is taken from
//    the template itself: the conversation is rendered once more with the last assistant content replaced
//    by a sentinel, and everything after the sentinel (the template's end of that message, e.g.
//    "<|im_end|>\n", then the new user message and the generation prompt) is the delta. Checked: the
//    rendering of everything up to the previous user message (rendered without generation prompt) must
//    be a prefix of the new rendering, the sentinel must occur once, after it, and the real rendering must
//    end with the same tail; if any check fails (e.g. /system changed the first message) the session is
//    reset and the whole conversation re-prefilled, and the turn says so.
//  HistoryMode::Template: the context always equals the template's rendering. The rendering is encoded
//    and compared with the session's tokens; when the session is a prefix only the rest is appended,
//    otherwise the session is reset and the whole rendering prefilled (re-prefill from the first
//    differing token would need a state snapshot there; with Qwen3.5 this is every turn after the first).
//
// The stop token that ends a reply is never fed (the template's own end of message is, with the next
// turn); a token sampled last because of -n, a stop string, Ctrl-C or a full context is fed at the start
// of the next turn ("pending"), so no decode step is spent on a token whose logits nobody reads.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/chat_text.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/pack.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace bonsai {

// ---- where the template comes from -------------------------------------------------------------------

struct ChatTemplateChoice {
  std::shared_ptr<const ChatTemplate> tmpl;
  std::string origin;     // e.g. "tokenizer.chat_template of x.gguf", "file t.jinja", "plain ChatML"
  bool fallback = false;  // the pack has no template: plain ChatML is used (say so to the user)
};

// format: "auto" (the pack's own template: GGUF tokenizer.chat_template, or the MLX folder's
// chat_template.jinja / tokenizer_config.json chat_template) or "chatml" (plain ChatML). A non-empty
// `template_file` wins over both. A template that does not parse throws bonsai::Error naming where it
// came from and the syntax error (line, column).
ChatTemplateChoice choose_chat_template(const Pack& pack, const std::string& format, const std::string& template_file = {});

// Special-token strings transformers passes to a template (bos_token, eos_token, pad_token when the
// vocabulary has them).
nlohmann::ordered_json chat_template_extras(const Tokenizer& tok);

// ---- a conversation ----------------------------------------------------------------------------------

enum class HistoryMode { Keep, Template };

struct ChatOptions {
  std::string system;            // system message ("" = none)
  bool think = true;             // enable_thinking; off also hides any reasoning the model still writes
  HistoryMode history = HistoryMode::Keep;
  int64_t max_new_tokens = -1;   // per reply (-n); < 0: until a stop id or the context is full
  SamplerOptions sampling;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;       // do not stop on the pack's stop ids (benchmarking, tests)
};

enum class StopReason { StopToken, StopString, Length, ContextFull, Interrupted };
const char* stop_reason_text(StopReason r);

// A user error that leaves the conversation as it was: the turn does not fit the context.
struct ContextFullError : Error {
  using Error::Error;
};

struct TurnStats {
  int64_t prefill_tokens = 0;   // tokens fed before the reply (the delta, or the whole conversation)
  bool reprefilled = false;     // the session was reset and the whole conversation fed
  std::string prefill_what;     // "new turn only", "first turn", "whole conversation re-prefilled: <why>"
  int64_t generated = 0;        // tokens sampled (a stop token included)
  int64_t decode_steps = 0;     // forwards of one generated token
  double prefill_seconds = 0;
  double decode_seconds = 0;    // decode steps, sampling and streaming included
  int64_t context_after = 0;    // tokens in the context after the turn (a pending token included)
  StopReason stop = StopReason::Length;
  double prefill_tok_s() const { return prefill_seconds > 0 ? double(prefill_tokens) / prefill_seconds : 0; }
  double decode_tok_s() const { return decode_seconds > 0 ? double(decode_steps) / decode_seconds : 0; }
};

struct TurnResult {
  std::string reasoning;            // text between <think> and </think> (trimmed)
  std::string answer;               // the rest (trimmed)
  std::vector<int32_t> tokens;      // sampled ids (a stop id, when hit, is the last)
  StopReason stop = StopReason::Length;
  TurnStats stats;
  std::vector<std::string> notes;   // e.g. the message contains control-token text
};

struct TurnCallbacks {
  // Streamed text of the reply, in order (reasoning pieces are passed even with think off: the caller
  // decides what to show; ChatOptions::think = false drops them from the stored reasoning too).
  std::function<void(ReplyPart, std::string_view)> on_text;
  // Polled between prefill blocks and before every sampled token (Ctrl-C).
  std::function<bool()> interrupted;
  // Notes about the input, before anything is fed (also kept in TurnResult::notes).
  std::function<void(std::string_view)> on_note;
};

class Chat {
 public:
  // The session, tokenizer and template must outlive the chat. The session is reset.
  Chat(Session& session, const Tokenizer& tok, std::shared_ptr<const ChatTemplate> tmpl, ChatOptions opt);

  // One turn. Throws bonsai::Error (TemplateError for the template, ContextFullError, invalid UTF-8,
  // empty message) before anything is fed: the conversation is then unchanged. An interruption during
  // the prefill returns stop = Interrupted with no reply; the message is dropped and the next turn
  // re-prefills the conversation.
  TurnResult turn(std::string_view user, const TurnCallbacks& cb = {});

  void reset();                      // empty conversation, empty session, sampler reseeded
  void set_system(std::string s);    // takes effect at the next turn (which then re-prefills)
  void set_think(bool on) { opt_.think = on; }
  const ChatOptions& options() const { return opt_; }

  int64_t context_tokens() const;    // tokens the context holds (a pending token included)
  int64_t capacity() const { return session_.capacity(); }
  size_t turns() const { return turns_; }
  const nlohmann::ordered_json& messages() const { return messages_; }  // user/assistant, no system
  const std::optional<TurnStats>& last_stats() const { return last_; }

  // The template's rendering of the conversation + `user` (as turn() would render it).
  std::string render_prompt(std::string_view user) const;

 private:
  nlohmann::ordered_json with_system(const nlohmann::ordered_json& msgs) const;
  std::string render(const nlohmann::ordered_json& msgs, bool add_generation_prompt) const;

  Session& session_;
  const Tokenizer& tok_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  ChatOptions opt_;
  nlohmann::ordered_json extras_;
  std::vector<int32_t> stop_ids_;
  Sampler sampler_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  std::string history_no_gen_;       // rendering up to the last user message, no generation prompt
  std::vector<int32_t> pending_;     // sampled, shown, not yet fed (at most one token)
  bool dirty_ = false;               // the session does not hold a known conversation: re-prefill
  size_t turns_ = 0;
  std::optional<TurnStats> last_;
};

}  // namespace bonsai
