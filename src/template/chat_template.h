// Chat templates: a jinja2 interpreter for the subset real chat templates use, rendering
// byte-identical to Python jinja2 the way transformers' apply_chat_template sets it up
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, json.dumps-based
// tojson, raise_exception and strftime_now globals). Parse once, render many; render() is const
// and thread-safe.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "util/error.h"

namespace bonsai {

namespace tpl {
struct Program;
}

// Every template failure. kind says whether the source is malformed (Syntax), the render hit an
// error (Runtime: undefined value used, type error, unsupported construct at run time), or the
// template itself called raise_exception(msg) (Raised: what() is exactly msg).
struct TemplateError : Error {
  enum class Kind { Syntax, Runtime, Raised };
  TemplateError(Kind kind, std::string detail, int line, int column);
  Kind kind;
  std::string detail;  // the message without location
  int line;            // 1-based template line, 0 when unknown
  int column;          // 1-based, 0 when unknown
};

class ChatTemplate {
 public:
  // Parses the source; throws TemplateError (Syntax) naming the construct and its line.
  explicit ChatTemplate(std::string source);
  ChatTemplate(const ChatTemplate&) = default;
  ChatTemplate& operator=(const ChatTemplate&) = default;
  ~ChatTemplate();

  // Renders with the given variables (a JSON object: messages, tools, add_generation_prompt, ...).
  // Object key order is kept (tojson prints keys in insertion order, like Python dicts).
  std::string render(const nlohmann::ordered_json& context) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const tpl::Program> program_;
};

// Renders a conversation as transformers' apply_chat_template(messages, tools=...,
// add_generation_prompt=..., enable_thinking=..., **extra) does: the context is
// {messages, tools (null when empty/absent), documents: null, add_generation_prompt,
// enable_thinking (only when given), then every key of `extra` (e.g. bos_token, eos_token)}.
std::string render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools = nullptr, bool add_generation_prompt = true,
                        std::optional<bool> enable_thinking = std::nullopt,
                        const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

// Plain ChatML (<|im_start|>role\ncontent<|im_end|>\n ... + "<|im_start|>assistant\n"), the
// fallback behind `--chat-format chatml`. Text parts of list contents are concatenated.
const std::string& chatml_template_source();
const ChatTemplate& chatml_template();

}  // namespace bonsai
