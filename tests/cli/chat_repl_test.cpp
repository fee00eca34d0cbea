// `bonsai chat` driven through a pseudo-terminal (forkpty: a real tty, so Ctrl-C is the terminal's ^C
// and the prompt is shown) and through pipes, and `bonsai run --chat` through a pipe, on the tiny pack.
// Replies of the random-weight model are random text: the tests look at the accounting lines
// (--verbose "[turn N: ...]", /stats), the messages, and what reaches stdout vs stderr.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "../model/tiny_packs.h"
#include "engine/chat.h"
#include "engine/pack_tokenizer.h"
#include "tokenizer/utf8.h"

using namespace bonsai;
using namespace bonsai::testing_support;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

// A child `bonsai ARGS...` on a pseudo-terminal.
class PtyChild {
 public:
  explicit PtyChild(const std::vector<std::string>& args) {
    struct winsize ws {};
    ws.ws_row = 50;
    ws.ws_col = 200;
    pid_ = forkpty(&fd_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      std::vector<std::string> all{BONSAI_BINARY};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(BONSAI_BINARY, argv.data());
      _exit(127);
    }
  }
  ~PtyChild() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  bool started() const { return pid_ > 0; }

  void send(const std::string& s) { ASSERT_EQ(write(fd_, s.data(), s.size()), ssize_t(s.size())); }

  // Reads until `needle` appears at or after mark(); on success the mark moves past it.
  bool wait_for(const std::string& needle, double timeout_s = 60) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const size_t at = out_.find(needle, mark_);
      if (at != std::string::npos) {
        mark_ = at + needle.size();
        return true;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) return false;
      if (!pump(100)) return out_.find(needle, mark_) != std::string::npos && wait_for(needle, 0);
    }
  }
  // Reads until at least `n` more bytes than mark() have arrived.
  bool wait_bytes(size_t n, double timeout_s = 60) {
    const auto t0 = std::chrono::steady_clock::now();
    while (out_.size() < mark_ + n) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) return false;
      if (!pump(100)) return out_.size() >= mark_ + n;
    }
    return true;
  }
  // Exit status, reading the rest of the output; -1 on timeout or a signal.
  int wait_exit(double timeout_s = 60) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
      const bool more = pump(100);
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        while (pump(0)) {
        }
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      (void)more;
    }
    return -1;
  }
  bool alive() {
    int st = 0;
    return !reaped_ && waitpid(pid_, &st, WNOHANG) == 0;
  }
  const std::string& out() const { return out_; }
  std::string since(size_t from) const { return out_.substr(std::min(from, out_.size())); }
  size_t mark() const { return mark_; }

 private:
  // One poll + read; false when the terminal is closed (the child exited).
  bool pump(int timeout_ms) {
    struct pollfd p {fd_, POLLIN, 0};
    const int r = poll(&p, 1, timeout_ms);
    if (r <= 0) return r == 0;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] != '\r') out_ += buf[i];  // the terminal writes \r\n
    return true;
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  size_t mark_ = 0;
};

struct Result {
  int code = -1;
  std::string out, err;
};

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `bonsai ARGS` with `input` on stdin (a pipe), stdout and stderr apart.
Result bonsai_piped(const std::string& args, const std::string& input = "") {
  static int n = 0;
  const std::string base = ::testing::TempDir() + "/chat_pipe_" + std::to_string(getpid()) + "_" + std::to_string(n++);
  { std::ofstream(base + ".in", std::ios::binary) << input; }
  const std::string cmd = std::string(BONSAI_BINARY) + " " + args + " < '" + base + ".in' > '" + base + ".out' 2> '" +
                          base + ".err'";
  const int st = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  return r;
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// "prefill 17 tokens (new turn only)" -> 17 and "new turn only", from the text after `from`.
struct PrefillLine {
  long long tokens = -1;
  std::string what;
  long long context = -1;
};
PrefillLine parse_turn(const std::string& s) {
  PrefillLine p;
  std::smatch m;
  if (std::regex_search(s, m, std::regex(R"(prefill (\d+) tokens \((.*?)\) in )"))) {
    p.tokens = std::stoll(m[1]);
    p.what = m[2];
  }
  if (std::regex_search(s, m, std::regex(R"(context (\d+)/)"))) p.context = std::stoll(m[1]);
  return p;
}
long long parse_stats_context(const std::string& s) {
  std::smatch m;
  return std::regex_search(s, m, std::regex(R"(context: (\d+) of)")) ? std::stoll(m[1]) : -1;
}

const Tokenizer& tiny_tokenizer() {
  static const Pack pack = open_pack(tiny_packs().pq2);
  static const std::unique_ptr<Tokenizer> tok = load_pack_tokenizer(pack);
  return *tok;
}
size_t n_tokens(const std::string& s) { return tiny_tokenizer().encode(s, true).size(); }

std::vector<std::string> chat_args(std::vector<std::string> extra) {
  std::vector<std::string> a{"chat", "-m", tiny_packs().pq2, "--threads", "2", "--color", "off", "--verbose"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace

TEST(ChatRepl, TwoTurnsOnATerminalSecondPrefillsOnlyTheNewTurnThenReset) {
  PtyChild c(chat_args({"-n", "8", "--ignore-eos", "--seed", "3"}));
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("Hello there\n");
  ASSERT_TRUE(c.wait_for("[turn 1: ")) << c.out();
  ASSERT_TRUE(c.wait_for("]\n")) << c.out();
  const PrefillLine t1 = parse_turn(c.out().substr(c.out().rfind("[turn 1: ")));
  const size_t p1 = n_tokens("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(t1.tokens, (long long)p1);
  EXPECT_EQ(t1.what, "first turn");
  EXPECT_EQ(t1.context, (long long)p1 + 8);  // 7 fed + 1 sampled last, fed with the next turn

  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("And now?\n");
  ASSERT_TRUE(c.wait_for("[turn 2: ")) << c.out();
  ASSERT_TRUE(c.wait_for("]\n")) << c.out();
  const PrefillLine t2 = parse_turn(c.out().substr(c.out().rfind("[turn 2: ")));
  const size_t delta = 1 + n_tokens("<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(t2.what, "new turn only");
  EXPECT_EQ(t2.tokens, (long long)delta);
  EXPECT_EQ(t2.context, t1.context + (long long)delta - 1 + 8);

  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  const size_t before_stats = c.mark();
  c.send("/stats\n");
  ASSERT_TRUE(c.wait_for("stop: ")) << c.out();
  const std::string stats = c.since(before_stats);
  EXPECT_EQ(parse_stats_context(stats), t2.context) << stats;
  EXPECT_THAT(stats, HasSubstr("2 turns"));
  EXPECT_THAT(stats, HasSubstr("last turn: prefill " + std::to_string(delta) + " tokens (new turn only)"));
  EXPECT_THAT(stats, HasSubstr("tok/s"));

  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("/reset\n");
  ASSERT_TRUE(c.wait_for("(new conversation")) << c.out();
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  const size_t before = c.mark();
  c.send("/stats\n");
  ASSERT_TRUE(c.wait_for("last turn: none yet")) << c.out();
  EXPECT_EQ(parse_stats_context(c.since(before)), 0);
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("Hello there\n");
  ASSERT_TRUE(c.wait_for("[turn 1: ")) << c.out();
  ASSERT_TRUE(c.wait_for("]\n")) << c.out();
  const PrefillLine t3 = parse_turn(c.out().substr(c.out().rfind("[turn 1: ")));
  EXPECT_EQ(t3.tokens, (long long)p1);
  EXPECT_EQ(t3.what, "first turn");

  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("/quit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

TEST(ChatRepl, CtrlCStopsTheReplyNotTheChat) {
  PtyChild c(chat_args({"-n", "100000", "--ignore-eos", "--ctx", "8192"}));
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("Tell me a long story\n");
  ASSERT_TRUE(c.wait_for("Tell me a long story\n")) << c.out();  // the terminal's echo
  ASSERT_TRUE(c.wait_bytes(1)) << c.out();                        // the first streamed bytes
  c.send("\x03");
  ASSERT_TRUE(c.wait_for("[interrupted]")) << c.out();
  EXPECT_THAT(c.out(), Not(HasSubstr("context full")));
  ASSERT_TRUE(c.wait_for("[turn 1: ")) << c.out();
  ASSERT_TRUE(c.wait_for("stop: interrupted")) << c.out();
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  EXPECT_TRUE(c.alive());

  // The chat answers the next turn, appending it to the interrupted one.
  c.send("Shorter please\n");
  ASSERT_TRUE(c.wait_for("Shorter please\n")) << c.out();
  ASSERT_TRUE(c.wait_bytes(1)) << c.out();
  c.send("\x03");
  ASSERT_TRUE(c.wait_for("[turn 2: ")) << c.out();
  ASSERT_TRUE(c.wait_for("]\n")) << c.out();
  EXPECT_EQ(parse_turn(c.out().substr(c.out().rfind("[turn 2: "))).what, "new turn only");
  ASSERT_TRUE(c.wait_for("> ")) << c.out();

  // Ctrl-C at the prompt: a hint, then a second one exits.
  c.send("\x03");
  ASSERT_TRUE(c.wait_for("Ctrl-C again")) << c.out();
  EXPECT_TRUE(c.alive());
  c.send("\x03");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

TEST(ChatRepl, ContextFullSaysSoAndResetRecovers) {
  PtyChild c(chat_args({"-n", "1000", "--ignore-eos", "--ctx", "40"}));
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("Hi\n");
  ASSERT_TRUE(c.wait_for("[context full: the reply stopped at 40 of 40 tokens. Type /reset")) << c.out();
  ASSERT_TRUE(c.wait_for("stop: context full")) << c.out();
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("And more?\n");
  ASSERT_TRUE(c.wait_for("error: context full: this turn needs")) << c.out();
  ASSERT_TRUE(c.wait_for("Type /reset to start a new conversation")) << c.out();
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("/reset\n");
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("Hi\n");
  ASSERT_TRUE(c.wait_for("[turn 1: ")) << c.out();
  ASSERT_TRUE(c.wait_for("> ")) << c.out();
  c.send("/quit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

TEST(ChatRepl, BadInputIsAClearMessageAndTheChatGoesOn) {
  // Through a pipe: no prompt, replies on stdout, messages on stderr.
  const std::string in = std::string("abc\xFF\xFE def\n") +  // invalid UTF-8
                         "   \n" +                               // empty
                         "/bogus\n" +                            // unknown command
                         "/think maybe\n" +                      //
                         "<|im_end|><|im_start|>\n" +            // only special tokens
                         "/stats\n";
  const Result r = bonsai_piped("chat -m " + q(tiny_packs().pq2) + " -n 4 --ignore-eos --verbose", in);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: the message is not valid UTF-8: byte 0xFF at offset 3"));
  EXPECT_THAT(r.err, HasSubstr("error: empty message: there is nothing to send"));
  EXPECT_THAT(r.err, HasSubstr("error: unknown command /bogus"));
  EXPECT_THAT(r.err, HasSubstr("error: /think takes on or off"));
  EXPECT_THAT(r.err, HasSubstr("note: the message contains control-token text (<|im_end|> <|im_start|>)"));
  EXPECT_THAT(r.err, HasSubstr("[turn 1: "));  // the special-token message got a reply
  EXPECT_THAT(r.out, HasSubstr("context: "));
  EXPECT_THAT(r.out, HasSubstr("1 turn\n"));  // only that one was a turn
  EXPECT_THAT(r.out, Not(HasSubstr("> ")));   // no prompt on a pipe
  EXPECT_FALSE(utf8::first_invalid(r.out).has_value());
}

TEST(ChatRepl, TemplateErrors) {
  const std::string dir = ::testing::TempDir() + "/chat_tpl_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/syntax.jinja") << "{% for m in messages %}{{ m.content }\n{% endfor %}";
  std::ofstream(dir + "/raise.jinja") << "{{ raise_exception('this template refuses: ' + messages[-1].content) }}";

  // A template that does not parse: the command fails before loading the model, naming file and line.
  Result r = bonsai_piped("chat -m " + q(tiny_packs().pq2) + " --chat-template-file " + q(dir + "/syntax.jinja"), "hi\n");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("chat template file " + dir + "/syntax.jinja: chat template syntax error at line 1"));
  EXPECT_THAT(r.err, HasSubstr("--chat-format chatml"));
  r = bonsai_piped("run --chat -p hi -m " + q(tiny_packs().pq2) + " --chat-template-file " + q(dir + "/missing.jinja"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--chat-template-file " + dir + "/missing.jinja: cannot read it"));

  // A template that raises while rendering: the message is dropped, the chat goes on.
  r = bonsai_piped("chat -m " + q(tiny_packs().pq2) + " -n 2 --chat-template-file " + q(dir + "/raise.jinja"),
                   "first\n/chat-format\nsecond\n");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: chat template file " + dir + "/raise.jinja: this template refuses: first (message dropped)"));
  EXPECT_THAT(r.err, HasSubstr("this template refuses: second"));
  r = bonsai_piped("run --chat -p boom -n 2 -m " + q(tiny_packs().pq2) + " --chat-template-file " + q(dir + "/raise.jinja"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("this template refuses: boom"));

  // A pack whose own template is broken (an MLX folder with a bad chat_template.jinja), and one without.
  const std::string bad = dir + "/bad_pack", none = dir + "/no_template_pack";
  for (const std::string& d : {bad, none}) {
    std::filesystem::remove_all(d);
    std::filesystem::copy(tiny_packs().mlx, d, std::filesystem::copy_options::recursive);
  }
  std::ofstream(bad + "/chat_template.jinja", std::ios::trunc) << "{% if messages %}{{ messages[0].content }}";
  std::filesystem::remove(none + "/chat_template.jinja");
  r = bonsai_piped("chat -m " + q(bad), "hi\n");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("the pack's chat template (" + bad + "/chat_template.jinja): chat template syntax error"));
  r = bonsai_piped("run --chat -p hi -n 2 --ignore-eos --json -m " + q(none));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["prompt"], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  r = bonsai_piped("run --chat -p hi -n 2 -m " + q(none));
  EXPECT_THAT(r.err, HasSubstr("note: the pack has no chat template; using plain ChatML"));
  // --chat-format chatml works on the broken pack.
  r = bonsai_piped("run --chat --chat-format chatml -p hi -n 2 -m " + q(bad));
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(ChatRun, AnswerAloneOnAPipeReasoningOnStderr) {
  const std::string base = "run --chat -m " + q(tiny_packs().pq2) + " -p Hello -n 24 --ignore-eos --temp 1 --seed 9 ";
  const Result j = bonsai_piped(base + "--json");
  ASSERT_EQ(j.code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["prompt"], "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n");
  const std::string prompt = doc["prompt"];
  EXPECT_EQ(doc["prompt_tokens"].get<size_t>(), n_tokens(prompt));
  EXPECT_EQ(doc["tokens"].size(), 24u);
  EXPECT_EQ(doc["stop"], "-n limit");

  const Result t = bonsai_piped(base);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, doc["answer"].get<std::string>() + "\n");  // stdout: the answer, nothing else
  EXPECT_FALSE(utf8::first_invalid(t.out).has_value());
  const std::string reasoning = doc["reasoning"];
  if (!reasoning.empty()) {  // on stderr, marked (no colour: stderr is a file)
    EXPECT_THAT(t.err, HasSubstr("[thinking] " + reasoning.substr(0, 6)));
  }
  EXPECT_THAT(t.err, HasSubstr("-- prompt " + std::to_string(n_tokens(prompt)) + " tokens"));

  // --think off: the template closes the block; no reasoning anywhere.
  const Result off = bonsai_piped(base + "--think off --json");
  ASSERT_EQ(off.code, 0) << off.err;
  const auto d2 = nlohmann::json::parse(off.out);
  EXPECT_EQ(d2["prompt"], "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(d2["reasoning"], "");

  const Result sys = bonsai_piped(base + "--system 'Be brief.' --chat-format chatml --json");
  ASSERT_EQ(sys.code, 0) << sys.err;
  EXPECT_EQ(nlohmann::json::parse(sys.out)["prompt"],
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatRun, StopStringsAndLimitsAreClear) {
  const std::string base = "run --chat -m " + q(tiny_packs().pq2) + " -p Hello -n 24 --ignore-eos --think off ";
  const auto a = nlohmann::json::parse(bonsai_piped(base + "--json").out);
  const std::string answer = a["answer"];
  std::string stop;  // two ASCII letters or digits from inside the answer (quotable, whole characters)
  for (size_t i = 1; i + 1 < answer.size() && stop.empty(); ++i)
    if (std::isalnum((unsigned char)answer[i]) && std::isalnum((unsigned char)answer[i + 1])) stop = answer.substr(i, 2);
  if (!stop.empty()) {
    const Result r = bonsai_piped(base + "--json --stop " + q(stop) + " --stop never-seen");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto b = nlohmann::json::parse(r.out);
    EXPECT_EQ(b["stop"], "stop string");
    EXPECT_EQ(answer.rfind(b["answer"].get<std::string>(), 0), 0u);
    EXPECT_LE(b["answer"].get<std::string>().size(), answer.find(stop));
  }
  Result r = bonsai_piped("run --chat -p '' -m " + q(tiny_packs().pq2));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("-p: empty message"));
  r = bonsai_piped("run --chat -p \"$(printf 'a\\377b')\" -m " + q(tiny_packs().pq2));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("not valid UTF-8: byte 0xFF at offset 1"));
  r = bonsai_piped("run --chat -p hi --ctx 8 -m " + q(tiny_packs().pq2));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("context full: this turn needs"));
  EXPECT_THAT(r.err, HasSubstr("larger --ctx"));
  r = bonsai_piped("run -p hi --think off -m " + q(tiny_packs().pq2));
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("--chat"));
  r = bonsai_piped("run --chat -p hi --stop '' -m " + q(tiny_packs().pq2));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("stop string must not be empty"));
}

TEST(ChatRepl, ChatMLKeepsOnlyTheNewTurnAndThePipeGetsReplies) {
  const Result r = bonsai_piped("chat -m " + q(tiny_packs().mlx) + " --chat-format chatml -n 5 --ignore-eos --verbose",
                                "one\ntwo\n");
  ASSERT_EQ(r.code, 0) << r.err;
  const PrefillLine t2 = parse_turn(r.err.substr(r.err.find("[turn 2: ")));
  EXPECT_EQ(t2.what, "new turn only");
  EXPECT_EQ(t2.tokens, (long long)(1 + n_tokens("<|im_end|>\n<|im_start|>user\ntwo<|im_end|>\n<|im_start|>assistant\n")));
  // stdout carries the answers only (reasoning, if the model opens a think block itself, goes to stderr).
  EXPECT_THAT(r.out, Not(HasSubstr("[thinking]")));
  EXPECT_FALSE(utf8::first_invalid(r.out).has_value());
}
