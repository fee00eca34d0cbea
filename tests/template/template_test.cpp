// Chat-template interpreter tests: every fixture rendered by Python jinja2 (tools/fixtures/
// gen_template_fixtures.py) must come out byte-identical; errors must be clear TemplateErrors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "template/chat_template.h"

using bonsai::ChatTemplate;
using bonsai::TemplateError;
using json = nlohmann::ordered_json;

namespace {

std::string data_path(const std::string& name) { return std::string(BONSAI_TEST_DATA) + "/template/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<json> rows;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

std::string show(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  return out;
}

// Checks one fixture row against a (possibly throwing) render; returns "" on success.
std::string check_row(const json& row, const std::function<std::string()>& render) {
  const std::string name = row.at("name").get<std::string>();
  if (row.contains("expected")) {
    const std::string want = row.at("expected").get<std::string>();
    std::string got;
    try {
      got = render();
    } catch (const std::exception& e) {
      return name + ": threw: " + e.what() + "\n  want: " + show(want);
    }
    if (got != want) {
      size_t k = 0;
      while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
      size_t from = k > 60 ? k - 60 : 0;
      return name + ": mismatch at byte " + std::to_string(k) + "\n  want: ..." + show(want.substr(from, 160)) +
             "\n  got:  ..." + show(got.substr(from, 160));
    }
    return "";
  }
  const std::string err = row.at("error").get<std::string>();
  const std::string type = row.at("error_type").get<std::string>();
  try {
    std::string got = render();
    return name + ": expected " + type + " (" + err + "), rendered: " + show(got.substr(0, 200));
  } catch (const TemplateError& e) {
    if (type == "TemplateError") {  // raise_exception(msg): the message, exactly
      if (e.kind != TemplateError::Kind::Raised || std::string(e.what()) != err)
        return name + ": want raise_exception '" + err + "', got: " + e.what();
      return "";
    }
    if (type == "TemplateSyntaxError" || type == "TemplateAssertionError") {
      if (e.kind != TemplateError::Kind::Syntax) return name + ": want a syntax error, got: " + e.what();
      return "";
    }
    if (type == "TypeError" && err == "no loader for this environment specified") return "";  // {% include %}
    if (std::string(e.what()).find(err) == std::string::npos)
      return name + ": want error containing '" + err + "', got: " + e.what();
    return "";
  } catch (const std::exception& e) {
    return name + ": threw a non-TemplateError: " + e.what();
  }
}

void report(const std::vector<std::string>& failures, size_t total) {
  std::string msg;
  for (size_t k = 0; k < failures.size() && k < 25; ++k) msg += failures[k] + "\n";
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << total << " fixtures failed:\n" << msg;
}

}  // namespace

TEST(TemplateFixtures, Qwen35MatchesJinja2) {
  ChatTemplate tmpl(read_file(data_path("qwen3.5-chat-template.jinja")));
  auto rows = read_jsonl(data_path("qwen35_fixtures.jsonl"));
  ASSERT_GE(rows.size(), 200u);
  std::vector<std::string> failures;
  for (const auto& row : rows) {
    std::string f = check_row(row, [&] { return tmpl.render(row.at("context")); });
    if (!f.empty()) failures.push_back(f);
  }
  report(failures, rows.size());
}

TEST(TemplateFixtures, FeaturesMatchJinja2) {
  auto rows = read_jsonl(data_path("features_fixtures.jsonl"));
  ASSERT_GE(rows.size(), 100u);
  std::vector<std::string> failures;
  for (const auto& row : rows) {
    std::string f = check_row(row, [&] {
      ChatTemplate t(row.at("template").get<std::string>());
      return t.render(row.at("context"));
    });
    if (!f.empty()) failures.push_back(f);
  }
  report(failures, rows.size());
}

// Extra fixtures in the features_fixtures.jsonl format (e.g. other models' templates rendered by the
// same generator), for local differential runs: BONSAI_TEMPLATE_EXTRA_FIXTURES=/path/to/rows.jsonl
TEST(TemplateFixtures, ExtraFixturesFromEnv) {
  const char* path = std::getenv("BONSAI_TEMPLATE_EXTRA_FIXTURES");
  if (!path || !*path) GTEST_SKIP() << "BONSAI_TEMPLATE_EXTRA_FIXTURES not set";
  auto rows = read_jsonl(path);
  std::vector<std::string> failures;
  for (const auto& row : rows) {
    std::string f = check_row(row, [&] {
      ChatTemplate t(row.at("template").get<std::string>());
      return t.render(row.at("context"));
    });
    if (!f.empty()) failures.push_back(f);
  }
  report(failures, rows.size());
}

TEST(TemplateFixtures, ParseOnceRenderManyThreads) {
  ChatTemplate tmpl(read_file(data_path("qwen3.5-chat-template.jinja")));
  auto rows = read_jsonl(data_path("qwen35_fixtures.jsonl"));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = static_cast<size_t>(t); k < rows.size(); k += 4) {
        if (!rows[k].contains("expected")) continue;
        if (tmpl.render(rows[k].at("context")) != rows[k].at("expected").get<std::string>()) ++bad[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

// ---- chat helpers -------------------------------------------------------------------------

TEST(ChatTemplate, RenderChatQwenGenerationPrompt) {
  ChatTemplate tmpl(read_file(data_path("qwen3.5-chat-template.jinja")));
  json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(bonsai::render_chat(tmpl, messages), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(bonsai::render_chat(tmpl, messages, nullptr, true, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(bonsai::render_chat(tmpl, messages, nullptr, false), "<|im_start|>user\nHi<|im_end|>\n");
  json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"description", "d"}}}}});
  std::string with_tools = bonsai::render_chat(tmpl, messages, tools, true);
  EXPECT_NE(with_tools.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\"}}\n</tools>"),
            std::string::npos)
      << with_tools;
}

TEST(ChatTemplate, ChatmlFallback) {
  EXPECT_EQ(bonsai::chatml_template_source(), read_file(data_path("chatml.jinja")));
  json messages = json::array({{{"role", "system"}, {"content", "S"}},
                               {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                                           {{"type", "text"}, {"text", "b"}}})}}});
  EXPECT_EQ(bonsai::render_chat(bonsai::chatml_template(), messages),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(bonsai::render_chat(bonsai::chatml_template(), messages, nullptr, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nab<|im_end|>\n");
}

TEST(ChatTemplate, RaiseExceptionCarriesMessage) {
  ChatTemplate tmpl(read_file(data_path("qwen3.5-chat-template.jinja")));
  try {
    tmpl.render(json{{"messages", json::array()}});
    FAIL() << "expected an error";
  } catch (const bonsai::Error& e) {  // catchable as the project-wide error type
    EXPECT_STREQ(e.what(), "No messages provided.");
    auto* te = dynamic_cast<const TemplateError*>(&e);
    ASSERT_NE(te, nullptr);
    EXPECT_EQ(te->kind, TemplateError::Kind::Raised);
  }
}

// ---- errors: clear messages naming the construct and the line -----------------------------

namespace {
TemplateError syntax_error(const std::string& src) {
  try {
    ChatTemplate t(src);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for: " << src;
  return TemplateError(TemplateError::Kind::Syntax, "", 0, 0);
}

TemplateError render_error(const std::string& src, const json& ctx = json::object()) {
  try {
    ChatTemplate t(src);
    t.render(ctx);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for: " << src;
  return TemplateError(TemplateError::Kind::Runtime, "", 0, 0);
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
}  // namespace

TEST(TemplateErrors, UnsupportedConstructNamesTagAndLine) {
  auto e = syntax_error("line one\nline two\n  {% include 'x.html' %}\n");
  EXPECT_EQ(e.kind, TemplateError::Kind::Syntax);
  EXPECT_EQ(e.line, 3);
  EXPECT_EQ(e.column, 6);
  EXPECT_TRUE(has(e.what(), "unsupported construct '{% include %}'")) << e.what();
  EXPECT_TRUE(has(e.what(), "line 3")) << e.what();
  for (const char* tag : {"extends", "block", "import", "from", "autoescape", "do"}) {
    auto e2 = syntax_error(std::string("{% ") + tag + " x %}");
    EXPECT_TRUE(has(e2.what(), std::string("unsupported construct '{% ") + tag + " %}'")) << e2.what();
  }
  auto e3 = syntax_error("\n{{ x|groupby('a') }}");
  EXPECT_TRUE(has(e3.what(), "filter 'groupby' is not supported")) << e3.what();
  EXPECT_EQ(e3.line, 2);
}

TEST(TemplateErrors, UnterminatedBlocks) {
  auto e = syntax_error("a\n{% for x in xs %}\n{% if x %}\n{{ x }}\n{% endfor %}");
  EXPECT_TRUE(has(e.what(), "unexpected '{% endfor %}'")) << e.what();
  EXPECT_TRUE(has(e.what(), "'{% if %}' from line 3")) << e.what();
  EXPECT_EQ(e.line, 5);
  auto e2 = syntax_error("{% macro m() %}\nbody");
  EXPECT_TRUE(has(e2.what(), "unterminated '{% macro %}' block opened at line 1")) << e2.what();
  EXPECT_TRUE(has(e2.what(), "'endmacro'")) << e2.what();
  auto e3 = syntax_error("x {{ 1 + ");
  EXPECT_TRUE(has(e3.what(), "unterminated '{{' tag")) << e3.what();
  auto e4 = syntax_error("{# never closed");
  EXPECT_TRUE(has(e4.what(), "Missing end of comment tag")) << e4.what();
  auto e5 = syntax_error("{% raw %} abc");
  EXPECT_TRUE(has(e5.what(), "Missing end of raw directive")) << e5.what();
  auto e6 = syntax_error("{% if x %}{% else %}{% elif y %}{% endif %}");
  EXPECT_TRUE(has(e6.what(), "unexpected '{% elif %}'")) << e6.what();
}

TEST(TemplateErrors, UnknownFilterTestAndTag) {
  auto e = syntax_error("ok\n\n{{ name | shout }}");
  EXPECT_TRUE(has(e.what(), "no filter named 'shout'")) << e.what();
  EXPECT_EQ(e.line, 3);
  auto e2 = syntax_error("{% if x is shouty %}{% endif %}");
  EXPECT_TRUE(has(e2.what(), "no test named 'shouty'")) << e2.what();
  auto e3 = syntax_error("{% frob %}");
  EXPECT_TRUE(has(e3.what(), "unknown tag 'frob'")) << e3.what();
  auto e4 = syntax_error("{{ 1 + }}");
  EXPECT_TRUE(has(e4.what(), "unexpected 'end of print statement'")) << e4.what();
  auto e5 = syntax_error("{% for x in xs %}{% endfor %}{% continue %}");
  EXPECT_TRUE(has(e5.what(), "'continue' outside loop")) << e5.what();
  // map('nope') resolves the filter name at render time
  auto e6 = render_error("{{ [1]|map('nope')|list }}");
  EXPECT_TRUE(has(e6.what(), "No filter named 'nope'")) << e6.what();
}

TEST(TemplateErrors, RuntimeErrorsCarryLine) {
  auto e = render_error("a\nb\n{{ x.y.z }}", json{{"x", json::object()}});
  EXPECT_EQ(e.kind, TemplateError::Kind::Runtime);
  EXPECT_EQ(e.line, 3);
  EXPECT_TRUE(has(e.what(), "'dict object' has no attribute 'y'")) << e.what();
  auto e2 = render_error("{% set d = {1: 'a'} %}");
  EXPECT_TRUE(has(e2.what(), "non-string key")) << e2.what();
  auto e3 = render_error("{{ 'abc'.encode() }}");
  EXPECT_TRUE(has(e3.what(), "unsupported construct: str.encode()")) << e3.what();
  auto e4 = render_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
  EXPECT_TRUE(has(e4.what(), "maximum recursion depth")) << e4.what();
}

TEST(TemplateErrors, NestingAndRecursionLimits) {
  std::string deep = "{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}";
  auto e = syntax_error(deep);
  EXPECT_TRUE(has(e.what(), "nested too deeply")) << e.what();
  std::string ok = "{{ " + std::string(50, '(') + "1" + std::string(50, ')') + " }}";
  EXPECT_EQ(ChatTemplate(ok).render(json::object()), "1");
  std::string blocks;
  for (int k = 0; k < 1000; ++k) blocks += "{% if true %}";
  auto e2 = syntax_error(blocks);
  EXPECT_TRUE(has(e2.what(), "nested too deeply")) << e2.what();
  // jinja2 itself gives up near depth 200 (Python's recursion limit); 150 must work
  ChatTemplate r("{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% endif %}x{% endmacro %}{{ r(N)|length }}");
  EXPECT_EQ(r.render(json{{"N", 150}}), "151");
  try {
    r.render(json{{"N", 100000}});
    FAIL() << "expected a recursion error";
  } catch (const TemplateError& err) {
    EXPECT_TRUE(has(err.what(), "maximum recursion depth exceeded")) << err.what();
  }
}

TEST(TemplateErrors, ContextMustBeObject) {
  ChatTemplate t("x");
  EXPECT_THROW(t.render(json::array()), bonsai::Error);
  EXPECT_EQ(t.render(json::object()), "x");
}

TEST(ChatTemplate, StrftimeNowUsesLocalTime) {
  ChatTemplate t("{{ strftime_now('%Y-%m-%d') }}");
  std::string s = t.render(json::object());
  ASSERT_EQ(s.size(), 10u);
  EXPECT_EQ(s[4], '-');
  EXPECT_EQ(s[7], '-');
}
