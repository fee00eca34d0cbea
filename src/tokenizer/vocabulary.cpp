#include "tokenizer/vocabulary.h"

#include <algorithm>

#include "tokenizer/pretokenizer.h"
#include "util/error.h"

namespace bonsai {

const char* token_type_name(int32_t type) {
  switch (type) {
    case 0: return "undefined";
    case 1: return "normal";
    case 2: return "unknown";
    case 3: return "control";
    case 4: return "user-defined";
    case 5: return "unused";
    case 6: return "byte";
    default: return "invalid";
  }
}

bool Vocabulary::is_added(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= token_types.size()) return false;
  const int32_t t = token_types[static_cast<size_t>(id)];
  return t == static_cast<int32_t>(TokenType::Control) || t == static_cast<int32_t>(TokenType::UserDefined);
}

std::vector<int32_t> Vocabulary::stop_ids() const {
  std::vector<int32_t> v;
  auto add = [&](int32_t id) {
    if (id >= 0 && std::find(v.begin(), v.end(), id) == v.end()) v.push_back(id);
  };
  add(eos_id);
  if (eot_id) add(*eot_id);
  for (int32_t id : extra_eos_ids) add(id);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (token_types[i] == static_cast<int32_t>(TokenType::Control) &&
        (tokens[i] == "<|im_end|>" || tokens[i] == "<|endoftext|>"))
      add(static_cast<int32_t>(i));
  return v;
}

std::optional<int32_t> Vocabulary::find(std::string_view token) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == token) return static_cast<int32_t>(i);
  return std::nullopt;
}

void Vocabulary::validate(std::string_view what) const {
  if (tokens.empty()) fail("{}: tokenizer vocabulary is empty", what);
  if (token_types.size() != tokens.size())
    fail("{}: tokenizer has {} tokens but {} token types", what, tokens.size(), token_types.size());
  for (size_t i = 0; i < token_types.size(); ++i)
    if (token_types[i] < 0 || token_types[i] > 6)
      fail("{}: token {} ('{}') has unknown token type {}", what, i, tokens[i], token_types[i]);
  const auto n = static_cast<int64_t>(tokens.size());
  auto check_id = [&](const char* key, std::optional<int32_t> id) {
    if (id && (*id < 0 || *id >= n)) fail("{}: {} = {} is outside the vocabulary (size {})", what, key, *id, n);
  };
  if (eos_id != -1) check_id("eos_token_id", eos_id);
  check_id("bos_token_id", bos_id);
  check_id("padding_token_id", pad_id);
  check_id("eot_token_id", eot_id);
  for (int32_t id : extra_eos_ids) check_id("eos_token_id (extra)", id);
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto sp = merges[i].find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= merges[i].size() ||
        merges[i].find(' ', sp + 1) != std::string::npos)
      fail("{}: merge {} ('{}') is not two tokens separated by one space", what, i, merges[i]);
  }
  (void)pretokenizer_hf_regex(pre);  // throws on an unknown name, listing the known ones
}

const std::vector<AddedTokenSpec>& qwen35_added_tokens() {
  static const std::vector<AddedTokenSpec> v = {
      {"<|endoftext|>", true},      {"<|im_start|>", true},       {"<|im_end|>", true},
      {"<|object_ref_start|>", true}, {"<|object_ref_end|>", true}, {"<|box_start|>", true},
      {"<|box_end|>", true},        {"<|quad_start|>", true},     {"<|quad_end|>", true},
      {"<|vision_start|>", true},   {"<|vision_end|>", true},     {"<|vision_pad|>", true},
      {"<|image_pad|>", true},      {"<|video_pad|>", true},      {"<tool_call>", false},
      {"</tool_call>", false},      {"<|fim_prefix|>", false},    {"<|fim_middle|>", false},
      {"<|fim_suffix|>", false},    {"<|fim_pad|>", false},       {"<|repo_name|>", false},
      {"<|file_sep|>", false},      {"<tool_response>", false},   {"</tool_response>", false},
      {"<think>", false},           {"</think>", false},          {"<|audio_start|>", true},
      {"<|audio_end|>", true},      {"<tts_pad>", true},          {"<tts_text_bos>", true},
      {"<tts_text_eod>", true},     {"<tts_text_bos_single>", true}, {"<|audio_pad|>", true},
  };
  return v;
}

std::vector<std::string> qwen35_added_token_texts() {
  std::vector<std::string> v;
  for (const auto& t : qwen35_added_tokens()) v.emplace_back(t.text);
  return v;
}

void pad_vocabulary(Vocabulary& v, size_t n) {
  while (v.tokens.size() < n) {
    v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
    v.token_types.push_back(static_cast<int32_t>(TokenType::Unused));
  }
}

}  // namespace bonsai
