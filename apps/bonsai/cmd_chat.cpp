// bonsai chat -m PACK [--system S] [--think on|off] [sampling] [--ctx N] [--backend B]: the interactive
// chat, and `bonsai run --chat` (run_chat_once), both on engine/chat.h.
//
// The REPL reads lines from stdin (a terminal or a pipe), one message per line (a line ending in '\'
// continues on the next), and streams each reply as it is decoded. The session is kept between turns:
// only the new turn is prefilled (see engine/chat.h for how the template's rendering is followed).
// Reasoning (between <think> and </think>) is shown apart from the answer: dimmed on a terminal,
// on stderr when stdout is not a terminal (so a pipe gets the answer alone), hidden with --think off.
// Ctrl-C stops the reply being generated and keeps the REPL; at the prompt a second Ctrl-C in a row
// exits, as do /quit and end of input.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "chat_cli.h"
#include "commands.h"
#include "engine/backends.h"
#include "engine/chat.h"
#include "engine/pack_tokenizer.h"
#include "model/forward.h"
#include "model/pack.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace bonsai::cli {

namespace {

volatile sig_atomic_t g_sigint = 0;
extern "C" void on_sigint(int) { g_sigint = 1; }

// SIGINT sets a flag instead of killing the process; no SA_RESTART, so a read() waiting at the prompt
// returns EINTR.
void catch_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

bool want_color(const std::string& mode, int fd) {
  if (mode == "on") return true;
  if (mode == "off") return false;
  const char* no = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  return isatty(fd) && !(no && *no) && !(term && std::strcmp(term, "dumb") == 0);
}

void write_all(FILE* f, std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

// Everything one chat needs, owned in construction order (the chat refers to the session, the session
// to the decoder, the decoder to the model and the backend).
struct ChatRuntime {
  Pack pack;
  std::unique_ptr<Tokenizer> tok;
  ChatTemplateChoice tmpl;
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<Session> session;
  std::unique_ptr<Chat> chat;
  int threads = 1;
};

ChatOptions chat_options(const ChatCliArgs& a) {
  ChatOptions o;
  o.system = a.system;
  o.think = a.think == "on";
  o.history = a.history == "template" ? HistoryMode::Template : HistoryMode::Keep;
  o.max_new_tokens = a.n;
  o.sampling = a.sampling;
  o.stop_strings = a.stop;
  o.ignore_eos = a.ignore_eos;
  return o;
}

std::unique_ptr<ChatRuntime> load_chat(const ChatCliArgs& a) {
  auto r = std::make_unique<ChatRuntime>();
  r->pack = open_pack(a.model);
  r->tok = load_pack_tokenizer(r->pack);
  if (!r->tok) fail("{}: the pack has no tokenizer, so it cannot chat (bonsai run --tokens works on ids)", a.model);
  r->tmpl = choose_chat_template(r->pack, a.chat_format, a.template_file);
  StopStrings check(a.stop);  // an empty --stop is an error before the model loads
  LoadOptions lo;
  lo.threads = a.threads;
  r->model = std::make_unique<Model>(load_model(r->pack, lo));
  BackendOptions bo;
  bo.threads = a.threads;
  bo.activations = a.act;
  bo.exclusive_model = true;  // this command's model serves this backend only
  r->backend = make_backend(a.backend, bo);
  r->decoder = std::make_unique<Decoder>(*r->model, *r->backend);
  SessionOptions so;
  so.capacity = a.ctx;
  r->session = std::make_unique<Session>(*r->decoder, so);
  r->chat = std::make_unique<Chat>(*r->session, *r->tok, r->tmpl.tmpl, chat_options(a));
  const auto* cpu = dynamic_cast<const CpuBackend*>(r->backend.get());
  r->threads = cpu ? cpu->threads() : 1;
  return r;
}

// Streams one reply: the answer to stdout; the reasoning dimmed in place on a terminal, else to stderr
// (dimmed when stderr is a terminal), or nowhere with --think off. Without colour the reasoning is marked
// "[thinking] ... [/thinking]".
class ReplyPrinter {
 public:
  ReplyPrinter(bool show_reasoning, const std::string& color)
      : show_reasoning_(show_reasoning),
        rfile_(isatty(1) ? stdout : stderr),
        color_(want_color(color, rfile_ == stdout ? 1 : 2)) {}

  void on_text(ReplyPart part, std::string_view text) {
    if (part == ReplyPart::Reasoning) {
      if (!show_reasoning_) return;
      if (!in_reasoning_) {
        if (rfile_ == stdout && out_line_open_) put(stdout, "\n\n");  // reasoning again after some answer
        put(rfile_, color_ ? "\x1b[2m" : "[thinking] ");
        in_reasoning_ = true;
      }
      put(rfile_, text);
      return;
    }
    if (in_reasoning_) {
      close_reasoning();
      if (rfile_ == stdout) put(stdout, "\n");  // a blank line between reasoning and answer
    }
    put(stdout, text);
  }

  // End of the reply: stdout ends on a new line; `always_newline`: even when nothing was written to it
  // (run --chat: stdout is then exactly the answer and a newline).
  void finish(bool always_newline) {
    close_reasoning();
    if (out_line_open_ || (always_newline && !out_used_)) put(stdout, "\n");
  }

 private:
  void put(FILE* f, std::string_view s) {
    if (s.empty()) return;
    write_all(f, s);
    if (f == stdout) {
      out_used_ = true;
      out_line_open_ = s.back() != '\n';
    }
  }
  void close_reasoning() {
    if (!in_reasoning_) return;
    put(rfile_, color_ ? "\x1b[0m\n" : "\n[/thinking]\n");
    in_reasoning_ = false;
  }

  bool show_reasoning_;
  FILE* rfile_;
  bool color_;
  bool in_reasoning_ = false;
  bool out_used_ = false;
  bool out_line_open_ = false;
};

std::string stats_line(const TurnStats& s) {
  return fmt::format("prefill {} tokens ({}) in {:.3f} s, {:.1f} tok/s | decode {} tokens in {:.3f} s, {:.1f} tok/s | "
                     "{} sampled, stop: {}",
                     s.prefill_tokens, s.prefill_what, s.prefill_seconds, s.prefill_tok_s(), s.decode_steps,
                     s.decode_seconds, s.decode_tok_s(), s.generated, stop_reason_text(s.stop));
}

// ---- bonsai chat -------------------------------------------------------------------------------------

enum class ReadStatus { Line, Eof, Interrupted };

// Lines from a file descriptor with read(2), so that Ctrl-C (EINTR) is seen while waiting.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  ReadStatus read(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line.assign(buf_, 0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return ReadStatus::Line;
      }
      if (eof_) {
        if (buf_.empty()) return ReadStatus::Eof;
        line = std::move(buf_);
        buf_.clear();
        return ReadStatus::Line;
      }
      char tmp[4096];
      if (g_sigint) return ReadStatus::Interrupted;  // delivered before read() could be interrupted by it
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n < 0) {
        if (errno == EINTR) {
          if (g_sigint) return ReadStatus::Interrupted;
          continue;
        }
        fail("reading stdin: {}", std::strerror(errno));
      }
      if (n == 0) eof_ = true;
      buf_.append(tmp, size_t(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
  bool eof_ = false;
};

const char* kHelp =
    "commands:\n"
    "  /reset          start a new conversation (empties the context)\n"
    "  /think on|off   thinking for the next replies (off: the template closes the think block)\n"
    "  /system TEXT    set the system message (/system alone clears it); the next turn re-prefills\n"
    "  /stats          tokens in the context, last turn's prefill and decode speed\n"
    "  /quit           exit (also Ctrl-D, or Ctrl-C twice at the prompt)\n"
    "  /help           this list\n"
    "A line ending in \\ continues on the next line; start a message with // to send a leading /.\n"
    "Ctrl-C stops the reply being generated.\n";

void print_stats(const Chat& chat) {
  std::printf("context: %lld of %lld tokens, %zu turn%s\n", static_cast<long long>(chat.context_tokens()),
              static_cast<long long>(chat.capacity()), chat.turns(), chat.turns() == 1 ? "" : "s");
  if (chat.last_stats())
    std::printf("last turn: %s\n", stats_line(*chat.last_stats()).c_str());
  else
    std::printf("last turn: none yet\n");
  std::fflush(stdout);
}

void chat_repl(const ChatCliArgs& a) {
  std::unique_ptr<ChatRuntime> rt = load_chat(a);
  Chat& chat = *rt->chat;
  const bool tty_in = isatty(0) != 0;

  std::fprintf(stderr, "bonsai chat: %s (%s), %s backend, context %lld tokens\n", a.model.c_str(),
               rt->pack.format_name().c_str(), rt->backend->name(), static_cast<long long>(chat.capacity()));
  std::fprintf(stderr, "template: %s; thinking %s\n", rt->tmpl.origin.c_str(), chat.options().think ? "on" : "off");
  if (rt->tmpl.fallback) std::fprintf(stderr, "note: the pack has no chat template; using plain ChatML\n");
  if (tty_in) std::fprintf(stderr, "Type a message. /help lists commands; Ctrl-C stops a reply; /quit or Ctrl-D exits.\n");
  std::fflush(stderr);

  catch_sigint();
  LineReader reader(0);
  int ctrl_c = 0;  // Ctrl-C at the prompt, in a row
  for (;;) {
    // g_sigint is NOT cleared here: whoever consumes a Ctrl-C clears it (the reply's interrupt, the
    // Interrupted branch below), so one typed as soon as "> " or the hint appears is never lost.
    if (tty_in) write_all(stdout, "> ");
    std::string line;
    ReadStatus st = reader.read(line);
    while (st == ReadStatus::Line && !line.empty() && line.back() == '\\') {  // continuation
      line.back() = '\n';
      if (tty_in) write_all(stdout, ". ");
      std::string more;
      st = reader.read(more);
      if (st == ReadStatus::Line) line += more;
    }
    if (st == ReadStatus::Eof) {
      if (tty_in) write_all(stdout, "\n");
      break;
    }
    if (st == ReadStatus::Interrupted) {
      g_sigint = 0;
      if (++ctrl_c >= 2) {
        write_all(stdout, "\n");
        break;
      }
      write_all(stderr, "\n(Ctrl-C again to exit, or /quit)\n");
      continue;
    }
    ctrl_c = 0;

    // commands
    if (line.size() >= 1 && line[0] == '/' && !(line.size() >= 2 && line[1] == '/')) {
      const size_t sp = line.find_first_of(" \t");
      const std::string cmd = line.substr(0, sp);
      const size_t from = sp == std::string::npos ? std::string::npos : line.find_first_not_of(" \t", sp);
      std::string arg = from == std::string::npos ? "" : line.substr(from);
      while (!arg.empty() && (arg.back() == ' ' || arg.back() == '\t')) arg.pop_back();
      if (cmd == "/quit" || cmd == "/exit") break;
      if (cmd == "/help") {
        write_all(stdout, kHelp);
      } else if (cmd == "/reset") {
        chat.reset();
        write_all(stderr, "(new conversation: the context is empty)\n");
      } else if (cmd == "/think") {
        if (arg == "on" || arg == "off") {
          chat.set_think(arg == "on");
          std::fprintf(stderr, "(thinking %s)\n", arg.c_str());
        } else if (arg.empty()) {
          std::fprintf(stderr, "thinking is %s (/think on|off)\n", chat.options().think ? "on" : "off");
        } else {
          std::fprintf(stderr, "error: /think takes on or off, got '%s'\n", arg.c_str());
        }
      } else if (cmd == "/system") {
        if (const auto bad = utf8::first_invalid(arg)) {
          std::fprintf(stderr, "error: the system message is not valid UTF-8 (byte 0x%02X at offset %zu); not set\n",
                       unsigned(static_cast<unsigned char>(arg[*bad])), *bad);
          continue;
        }
        chat.set_system(arg);
        std::fprintf(stderr, arg.empty() ? "(system message cleared" : "(system message set");
        std::fprintf(stderr, chat.turns() ? "; the next turn re-prefills the conversation)\n" : ")\n");
      } else if (cmd == "/stats") {
        print_stats(chat);
      } else {
        std::fprintf(stderr, "error: unknown command %s (/help lists them; start a message with // to send a leading /)\n",
                     cmd.c_str());
      }
      std::fflush(stderr);
      continue;
    }
    if (line.rfind("//", 0) == 0) line.erase(0, 1);

    // a turn
    ReplyPrinter printer(chat.options().think, a.color);
    TurnCallbacks cb;
    cb.on_text = [&](ReplyPart p, std::string_view t) { printer.on_text(p, t); };
    cb.interrupted = [] { return g_sigint != 0; };
    cb.on_note = [](std::string_view n) { std::fprintf(stderr, "note: %.*s\n", int(n.size()), n.data()); };
    try {
      const TurnResult r = chat.turn(line, cb);
      printer.finish(false);
      if (r.stop == StopReason::Interrupted) {
        g_sigint = 0;
        std::fprintf(stderr, "[interrupted]\n");
      } else if (r.stop == StopReason::ContextFull) {
        std::fprintf(stderr,
                     "[context full: the reply stopped at %lld of %lld tokens. Type /reset to start a new "
                     "conversation (or restart with a larger --ctx)]\n",
                     static_cast<long long>(chat.context_tokens()), static_cast<long long>(chat.capacity()));
      }
      if (a.verbose)
        std::fprintf(stderr, "[turn %zu: %s | context %lld/%lld]\n", chat.turns(), stats_line(r.stats).c_str(),
                     static_cast<long long>(chat.context_tokens()), static_cast<long long>(chat.capacity()));
    } catch (const ContextFullError& e) {
      printer.finish(false);
      std::fprintf(stderr, "error: %s. Type /reset to start a new conversation (or restart with a larger --ctx).\n",
                   e.what());
    } catch (const TemplateError& e) {
      printer.finish(false);
      std::fprintf(stderr, "error: %s: %s (message dropped)\n", rt->tmpl.origin.c_str(), e.what());
    } catch (const Error& e) {
      printer.finish(false);
      std::fprintf(stderr, "error: %s (message dropped)\n", e.what());
    }
    std::fflush(stderr);
  }
}

}  // namespace

// ---- shared options and bonsai run --chat ------------------------------------------------------------

std::vector<CLI::Option*> add_chat_options(CLI::App* cmd, ChatCliArgs& a, bool multi_turn) {
  std::vector<CLI::Option*> v;
  v.push_back(cmd->add_option("--system", a.system, "System message"));
  v.push_back(cmd->add_option("--think", a.think, "Thinking: on, or off (the template closes an empty think block; any "
                                                   "reasoning is hidden)")
                  ->check(CLI::IsMember({"on", "off"}))
                  ->capture_default_str());
  v.push_back(cmd->add_option("--chat-format", a.chat_format,
                              "auto (the pack's chat template; plain ChatML when it has none) or chatml")
                  ->check(CLI::IsMember({"auto", "chatml"}))
                  ->capture_default_str());
  v.push_back(cmd->add_option("--chat-template-file", a.template_file, "Jinja chat template to use instead of the pack's"));
  if (multi_turn)
    v.push_back(cmd->add_option("--history", a.history,
                              "keep (earlier replies stay in the context as generated; each turn prefills only itself) "
                              "or template (the context always equals the template's rendering; re-prefills when the "
                              "template re-renders earlier turns, e.g. Qwen3.5 dropping their reasoning)")
                  ->check(CLI::IsMember({"keep", "template"}))
                  ->capture_default_str());
  v.push_back(cmd->add_option("--stop", a.stop, "Stop string (repeatable): the reply ends before it"));
  v.push_back(cmd->add_option("--color", a.color, "Dim the reasoning: auto (a terminal without NO_COLOR), on, off")
                  ->check(CLI::IsMember({"auto", "on", "off"}))
                  ->capture_default_str());
  return v;
}

void run_chat_once(const ChatCliArgs& a) {
  std::unique_ptr<ChatRuntime> rt = load_chat(a);
  Chat& chat = *rt->chat;
  if (rt->tmpl.fallback && !a.json) std::fprintf(stderr, "note: the pack has no chat template; using plain ChatML\n");
  ReplyPrinter printer(chat.options().think, a.color);
  TurnCallbacks cb;
  if (!a.json) cb.on_text = [&](ReplyPart p, std::string_view t) { printer.on_text(p, t); };
  cb.on_note = [](std::string_view n) { std::fprintf(stderr, "note: %.*s\n", int(n.size()), n.data()); };
  std::string prompt_text;
  TurnResult r;
  try {
    prompt_text = chat.render_prompt(a.prompt);
    r = chat.turn(a.prompt, cb);
  } catch (const ContextFullError& e) {
    fail("-p: {} (use a larger --ctx)", e.what());
  } catch (const TemplateError& e) {
    fail("{}: {}", rt->tmpl.origin, e.what());
  } catch (const Error& e) {
    fail("-p: {}", e.what());
  }
  const TurnStats& s = r.stats;
  if (a.json) {
    nlohmann::ordered_json j;
    j["prompt"] = prompt_text;
    j["prompt_tokens"] = s.prefill_tokens;
    j["reasoning"] = r.reasoning;
    j["answer"] = r.answer;
    j["tokens"] = r.tokens;
    j["stop"] = stop_reason_text(r.stop);
    j["template"] = rt->tmpl.origin;
    j["backend"] = rt->backend->name();
    j["threads"] = rt->threads;
    j["stats"] = {{"prefill_tokens", s.prefill_tokens}, {"generated", s.generated},
                  {"decode_steps", s.decode_steps},     {"prefill_seconds", s.prefill_seconds},
                  {"decode_seconds", s.decode_seconds}, {"prefill_tok_s", s.prefill_tok_s()},
                  {"decode_tok_s", s.decode_tok_s()}};
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return;
  }
  printer.finish(true);
  if (r.stop == StopReason::ContextFull)
    std::fprintf(stderr, "[context full: the reply stopped at %lld tokens; use a larger --ctx]\n",
                 static_cast<long long>(chat.context_tokens()));
  std::fprintf(stderr, "-- prompt %lld tokens | %s | %s backend, %d thread%s\n", static_cast<long long>(s.prefill_tokens),
               stats_line(s).c_str(), rt->backend->name(), rt->threads, rt->threads == 1 ? "" : "s");
}

void register_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Interactive chat with a pack (reads messages from stdin; /help for commands)");
  auto a = std::make_shared<ChatCliArgs>();
  // Published thinking-mode sampling defaults (FACTS.md section 7).
  a->sampling.temperature = 1.0f;
  a->sampling.top_p = 0.95f;
  a->sampling.top_k = 20;
  a->sampling.min_p = 0.05f;
  cmd->add_option("-m,--model", a->model, "Pack: GGUF file or MLX folder")->required();
  add_chat_options(cmd, *a, /*multi_turn=*/true);
  cmd->add_option("-n,--n-predict", a->n, "Tokens per reply at most (-1: until a stop token or the context is full)")
      ->capture_default_str();
  cmd->add_option("--temp", a->sampling.temperature, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", a->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", a->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str();
  cmd->add_option("--repeat-last-n", a->sampling.repeat_last_n, "Tokens the penalty looks back (-1: all)")
      ->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "Sampling seed (/reset restarts it)")->capture_default_str();
  cmd->add_option("--ctx", a->ctx, "Context (KV capacity) in tokens (0: min(context length, 4096))")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0: all)")->capture_default_str();
  cmd->add_option("--act", a->act, kActHelp);
  cmd->add_option("--backend", a->backend, "ref (fp64 reference, slow) or cpu")->capture_default_str();
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop a reply on the pack's stop ids (benchmarking, tests)");
  cmd->add_flag("-v,--verbose", a->verbose, "After each reply, a line with the turn's prefill and decode accounting");
  cmd->callback([a] { chat_repl(*a); });
}

}  // namespace bonsai::cli
