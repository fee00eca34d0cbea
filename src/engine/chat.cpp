#include "engine/chat.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "format/mlx_pack.h"
#include "tokenizer/utf8.h"

namespace bonsai {

namespace {

using ojson = nlohmann::ordered_json;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string base_name(const std::string& path) {
  const size_t s = path.find_last_of('/');
  return s == std::string::npos ? path : path.substr(s + 1);
}

std::shared_ptr<const ChatTemplate> parse_template(std::string source, const std::string& origin) {
  try {
    return std::make_shared<const ChatTemplate>(std::move(source));
  } catch (const Error& e) {
    fail("{}: {} (--chat-format chatml chats with plain ChatML instead)", origin, e.what());
  }
}

// Stands in for the previous reply's content when locating where the template's rendering of the new
// turn begins (HistoryMode::Keep). Plain ASCII letters: survives trim, split and the like.
constexpr std::string_view kReplySentinel = "BonsaiReplySentinel7f3c9a0e";

// Blocks the prefill is fed in, so Ctrl-C is seen during a long prefill; a multiple of the planner's
// largest chunk keeps the chunking as efficient as one append.
constexpr size_t kPrefillBlock = 512;

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; });
}

}  // namespace

// ---- template choice ---------------------------------------------------------------------------------

ChatTemplateChoice choose_chat_template(const Pack& pack, const std::string& format, const std::string& template_file) {
  ChatTemplateChoice c;
  if (!template_file.empty()) {
    std::ifstream in(template_file, std::ios::binary);
    if (!in) fail("--chat-template-file {}: cannot read it ({})", template_file, std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    c.origin = "chat template file " + template_file;
    c.tmpl = parse_template(ss.str(), c.origin);
    return c;
  }
  if (format == "chatml") {
    c.tmpl = std::shared_ptr<const ChatTemplate>(&chatml_template(), [](const ChatTemplate*) {});
    c.origin = "plain ChatML (--chat-format chatml)";
    return c;
  }
  if (format != "auto") fail("--chat-format: '{}' is not one of: auto, chatml", format);

  std::optional<std::string> src;
  if (pack.gguf) {
    src = pack.gguf->opt_str("tokenizer.chat_template");
    c.origin = "the pack's chat template (tokenizer.chat_template in " + base_name(pack.path) + ")";
  } else if (pack.mlx) {
    if (pack.mlx->has_file("chat_template.jinja")) {
      const std::string f = pack.mlx->file("chat_template.jinja");
      std::ifstream in(f, std::ios::binary);
      if (!in) fail("{}: cannot read it ({})", f, std::strerror(errno));
      std::stringstream ss;
      ss << in.rdbuf();
      src = ss.str();
      c.origin = "the pack's chat template (" + f + ")";
    } else if (pack.mlx->has_file("tokenizer_config.json")) {
      const std::string f = pack.mlx->file("tokenizer_config.json");
      const nlohmann::json cfg = read_json_file(f);
      const auto it = cfg.find("chat_template");
      if (it != cfg.end() && it->is_string()) {
        src = it->get<std::string>();
      } else if (it != cfg.end() && it->is_array()) {  // [{name, template}, ...]: the "default" one
        for (const auto& t : *it)
          if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
            src = t["template"].get<std::string>();
        if (!src) fail("{}: chat_template is a list without a 'default' entry", f);
      } else if (it != cfg.end() && !it->is_null()) {
        fail("{}: chat_template must be a string or a list of {{name, template}}, got {}", f, it->type_name());
      }
      c.origin = "the pack's chat template (chat_template in " + f + ")";
    }
  }
  if (!src || src->empty()) {
    c.tmpl = std::shared_ptr<const ChatTemplate>(&chatml_template(), [](const ChatTemplate*) {});
    c.origin = "plain ChatML (the pack has no chat template)";
    c.fallback = true;
    return c;
  }
  c.tmpl = parse_template(std::move(*src), c.origin);
  return c;
}

nlohmann::ordered_json chat_template_extras(const Tokenizer& tok) {
  ojson x = ojson::object();
  const Vocabulary& v = tok.vocab();
  auto text = [&](int32_t id) -> std::optional<std::string> {
    if (id < 0 || id >= tok.n_vocab()) return std::nullopt;
    return tok.token_bytes(id);
  };
  if (v.bos_id)
    if (auto t = text(*v.bos_id)) x["bos_token"] = *t;
  if (auto t = text(v.eos_id)) x["eos_token"] = *t;
  if (v.pad_id)
    if (auto t = text(*v.pad_id)) x["pad_token"] = *t;
  return x;
}

const char* stop_reason_text(StopReason r) {
  switch (r) {
    case StopReason::StopToken: return "stop token";
    case StopReason::StopString: return "stop string";
    case StopReason::Length: return "-n limit";
    case StopReason::ContextFull: return "context full";
    case StopReason::Interrupted: return "interrupted";
  }
  return "?";
}

// ---- Chat --------------------------------------------------------------------------------------------

Chat::Chat(Session& session, const Tokenizer& tok, std::shared_ptr<const ChatTemplate> tmpl, ChatOptions opt)
    : session_(session),
      tok_(tok),
      tmpl_(std::move(tmpl)),
      opt_(std::move(opt)),
      extras_(chat_template_extras(tok)),
      stop_ids_(opt_.ignore_eos ? std::vector<int32_t>{} : tok.vocab().stop_ids()),
      sampler_(opt_.sampling, session.decoder().vocab()) {
  if (!tmpl_) fail("chat: no chat template");
  StopStrings check(opt_.stop_strings);  // rejects empty stop strings now, not at the first turn
  session_.reset();
}

void Chat::reset() {
  messages_ = ojson::array();
  history_no_gen_.clear();
  pending_.clear();
  dirty_ = false;
  turns_ = 0;
  last_.reset();
  session_.reset();
  sampler_.reseed(opt_.sampling.seed);
}

void Chat::set_system(std::string s) { opt_.system = std::move(s); }

int64_t Chat::context_tokens() const { return session_.position() + int64_t(pending_.size()); }

ojson Chat::with_system(const ojson& msgs) const {
  if (opt_.system.empty()) return msgs;
  ojson all = ojson::array();
  all.push_back({{"role", "system"}, {"content", opt_.system}});
  for (const auto& m : msgs) all.push_back(m);
  return all;
}

std::string Chat::render(const ojson& msgs, bool add_generation_prompt) const {
  return render_chat(*tmpl_, with_system(msgs), nullptr, add_generation_prompt, opt_.think, extras_);
}

std::string Chat::render_prompt(std::string_view user) const {
  ojson msgs = messages_;
  msgs.push_back({{"role", "user"}, {"content", std::string(user)}});
  return render(msgs, true);
}

TurnResult Chat::turn(std::string_view user, const TurnCallbacks& cb) {
  // ---- checks: nothing is touched until the turn is known to be feedable
  if (const auto bad = utf8::first_invalid(user))
    fail("the message is not valid UTF-8: byte 0x{:02X} at offset {} does not start a valid character",
         unsigned(static_cast<unsigned char>(user[*bad])), *bad);
  if (all_space(user)) fail("empty message: there is nothing to send");
  if (const auto bad = utf8::first_invalid(opt_.system))
    fail("the system message is not valid UTF-8: byte 0x{:02X} at offset {}", unsigned(static_cast<unsigned char>(opt_.system[*bad])), *bad);

  TurnResult res;
  {
    std::vector<std::string> ctl;
    for (int32_t id : tok_.encode(user, true))
      if (tok_.is_control(id) && std::find(ctl.begin(), ctl.end(), tok_.token_bytes(id)) == ctl.end())
        ctl.push_back(tok_.token_bytes(id));
    if (!ctl.empty()) {
      std::string list;
      for (const auto& t : ctl) list += (list.empty() ? "" : " ") + t;
      res.notes.push_back("the message contains control-token text (" + list +
                          "): it is read as those special tokens, as in the rendered prompt");
    }
  }
  if (cb.on_note)
    for (const std::string& n : res.notes) cb.on_note(n);

  ojson msgs = messages_;
  msgs.push_back({{"role", "user"}, {"content", std::string(user)}});
  const std::string full = render(msgs, true);      // TemplateError propagates: nothing changed yet
  const std::string no_gen = render(msgs, false);

  std::vector<int32_t> feed;
  bool reset_first = false;
  std::string what;
  auto whole = [&](const std::string& why) {
    feed = tok_.encode(full, true);
    reset_first = session_.position() > 0 || !pending_.empty();
    what = why;
  };
  if (dirty_) {
    whole("whole conversation re-prefilled: the previous prefill was interrupted");
  } else if (session_.position() == 0 && pending_.empty()) {
    whole(messages_.empty() ? "first turn" : "whole conversation");
  } else if (opt_.history == HistoryMode::Template) {
    std::vector<int32_t> all = tok_.encode(full, true);
    std::vector<int32_t> held = session_.history();
    held.insert(held.end(), pending_.begin(), pending_.end());
    const size_t d = size_t(std::mismatch(held.begin(), held.end(), all.begin(), all.end()).first - held.begin());
    if (d == held.size() && all.size() > held.size()) {
      feed.assign(all.begin() + ptrdiff_t(session_.history().size()), all.end());  // pending included
      what = "new turn only";
    } else {
      whole(fmt::format("whole conversation re-prefilled: the template renders the context differently from "
                        "token {} of {} on",
                        d, held.size()));
    }
  } else {
    // HistoryMode::Keep: the template's own text for the new turn, located with a sentinel reply.
    std::string why;
    const size_t last = msgs.size() - 2;  // the previous assistant message
    if (messages_.empty() || msgs[last].value("role", "") != "assistant") {
      why = "no previous reply";
    } else if (full.compare(0, history_no_gen_.size(), history_no_gen_) != 0) {
      why = "the earlier conversation renders differently now (the system message changed?)";
    } else {
      ojson probe = msgs;
      probe[last]["content"] = std::string(kReplySentinel);
      const std::string sent = render(probe, true);
      const size_t at = sent.find(kReplySentinel);
      if (at == std::string::npos || sent.find(kReplySentinel, at + 1) != std::string::npos || at < history_no_gen_.size()) {
        why = "the template does not show the previous reply once, after the earlier turns";
      } else {
        const std::string_view tail = std::string_view(sent).substr(at + kReplySentinel.size());
        if (tail.size() > full.size() || full.compare(full.size() - tail.size(), tail.size(), tail) != 0) {
          why = "the template renders the new turn differently depending on the previous reply";
        } else {
          feed = pending_;
          tok_.encode(tail, true, feed);
          what = "new turn only";
        }
      }
    }
    if (!why.empty()) whole("whole conversation re-prefilled: " + why);
  }
  if (feed.empty()) fail("the chat template rendered nothing to feed for this turn");
  const int64_t room = reset_first ? session_.capacity() : session_.remaining();
  if (int64_t(feed.size()) + 1 > room)
    throw ContextFullError(fmt::format("context full: this turn needs {} tokens (+1 to reply) and {} of the {} "
                                       "context tokens are free",
                                       feed.size(), room, session_.capacity()));

  // ---- prefill
  res.stats.prefill_what = what;
  res.stats.reprefilled = reset_first;
  res.stats.prefill_tokens = int64_t(feed.size());
  if (reset_first) {
    session_.reset();
    pending_.clear();
  }
  dirty_ = true;  // until the whole turn prompt is in
  const auto t0 = std::chrono::steady_clock::now();
  // The logits after what was fed stay on the backend; Session::next_token picks there when it can.
  for (size_t off = 0; off < feed.size();) {
    const size_t m = std::min(kPrefillBlock, feed.size() - off);
    session_.append_kept(std::span<const int32_t>(feed.data() + off, m));
    pending_.clear();
    off += m;
    if (off < feed.size() && cb.interrupted && cb.interrupted()) {
      res.stop = res.stats.stop = StopReason::Interrupted;
      res.stats.prefill_tokens = int64_t(off);
      res.stats.prefill_seconds = seconds_since(t0);
      res.stats.context_after = context_tokens();
      last_ = res.stats;
      return res;  // the message is dropped; dirty_ makes the next turn re-prefill the conversation
    }
  }
  dirty_ = false;
  res.stats.prefill_seconds = seconds_since(t0);

  // ---- reply
  StreamingDecoder decoder(tok_, /*skip_special=*/true);
  StopStrings stops(opt_.stop_strings);
  ReasoningSplitter split(ReasoningSplitter::opens_reasoning(full));
  std::vector<ReplyPiece> pieces;
  std::string shown;
  auto deliver = [&](const std::string& text, bool final) {
    shown.clear();
    stops.push(text, shown);
    if (final) stops.flush(shown);
    pieces.clear();
    split.push(shown, pieces);
    if (final) split.finish(pieces);
    for (const ReplyPiece& p : pieces) {
      (p.part == ReplyPart::Reasoning ? res.reasoning : res.answer) += p.text;
      if (cb.on_text) cb.on_text(p.part, p.text);
    }
  };
  auto is_stop = [&](int32_t t) { return std::find(stop_ids_.begin(), stop_ids_.end(), t) != stop_ids_.end(); };

  const auto t1 = std::chrono::steady_clock::now();
  const int64_t max_new = opt_.max_new_tokens;
  std::string text;
  for (;;) {
    if (max_new >= 0 && int64_t(res.tokens.size()) >= max_new) {
      res.stop = StopReason::Length;
      break;
    }
    if (cb.interrupted && cb.interrupted()) {
      res.stop = StopReason::Interrupted;
      break;
    }
    if (session_.remaining() <= 0) {  // the last token fed filled the context: nothing more can follow it
      res.stop = StopReason::ContextFull;
      break;
    }
    const int32_t t = session_.next_token(sampler_, session_.history());
    res.tokens.push_back(t);
    if (is_stop(t)) {
      res.stop = StopReason::StopToken;
      break;
    }
    text.clear();
    if (t < tok_.n_vocab()) decoder.push(t, text);  // padding rows of the head have no text
    deliver(text, false);
    pending_.assign(1, t);
    if (stops.hit()) {
      res.stop = StopReason::StopString;
      break;
    }
    if (max_new >= 0 && int64_t(res.tokens.size()) >= max_new) {
      res.stop = StopReason::Length;
      break;
    }
    if (cb.interrupted && cb.interrupted()) {
      res.stop = StopReason::Interrupted;
      break;
    }
    session_.append_kept(std::span<const int32_t>(&t, 1));
    pending_.clear();
    ++res.stats.decode_steps;
  }
  deliver(decoder.flush(), true);
  res.stats.decode_seconds = seconds_since(t1);
  res.stats.generated = int64_t(res.tokens.size());
  res.stats.stop = res.stop;
  if (!opt_.think) res.reasoning.clear();

  messages_.push_back({{"role", "user"}, {"content", std::string(user)}});
  messages_.push_back({{"role", "assistant"}, {"content", res.answer}, {"reasoning_content", res.reasoning}});
  history_no_gen_ = no_gen;
  ++turns_;
  res.stats.context_after = context_tokens();
  last_ = res.stats;
  return res;
}

}  // namespace bonsai
