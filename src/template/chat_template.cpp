#include "template/chat_template.h"

#include <fmt/format.h>

#include "template/ast.h"
#include "template/interp.h"

namespace bonsai {

namespace {
std::string format_error(TemplateError::Kind kind, const std::string& detail, int line, int column) {
  switch (kind) {
    case TemplateError::Kind::Raised: return detail;
    case TemplateError::Kind::Syntax:
      if (column > 0) return fmt::format("chat template syntax error at line {}, column {}: {}", line, column, detail);
      return fmt::format("chat template syntax error at line {}: {}", line, detail);
    case TemplateError::Kind::Runtime:
      if (line > 0) return fmt::format("chat template error at line {}: {}", line, detail);
      return fmt::format("chat template error: {}", detail);
  }
  return detail;
}
}  // namespace

TemplateError::TemplateError(Kind k, std::string d, int l, int c)
    : Error(format_error(k, d, l, c)), kind(k), detail(std::move(d)), line(l), column(c) {}

ChatTemplate::ChatTemplate(std::string source)
    : source_(std::move(source)), program_(tpl::parse(source_)) {}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) fail("chat template: the render context must be a JSON object, got {}", context.type_name());
  tpl::Value ctx;
  try {
    ctx = tpl::from_json(context);
  } catch (const tpl::PyError& e) {
    throw TemplateError(TemplateError::Kind::Runtime, e.message, 0, 0);
  }
  tpl::Interp in(*program_, std::move(ctx));
  return in.run();
}

std::string render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        std::optional<bool> enable_thinking, const nlohmann::ordered_json& extra) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (enable_thinking) ctx["enable_thinking"] = *enable_thinking;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  return tmpl.render(ctx);
}

const std::string& chatml_template_source() {
  static const std::string src =
      "{%- for message in messages %}\n"
      "{{- '<|im_start|>' + message['role'] + '\\n' }}\n"
      "{%- if message['content'] is string %}\n"
      "{{- message['content'] }}\n"
      "{%- elif message['content'] is iterable and message['content'] is not mapping %}\n"
      "{%- for part in message['content'] %}\n"
      "{%- if part is mapping and part.get('type', 'text') == 'text' %}\n"
      "{{- part.get('text', '') }}\n"
      "{%- endif %}\n"
      "{%- endfor %}\n"
      "{%- endif %}\n"
      "{{- '<|im_end|>\\n' }}\n"
      "{%- endfor %}\n"
      "{%- if add_generation_prompt %}\n"
      "{{- '<|im_start|>assistant\\n' }}\n"
      "{%- endif %}\n";
  return src;
}

const ChatTemplate& chatml_template() {
  static const ChatTemplate t(chatml_template_source());
  return t;
}

}  // namespace bonsai
