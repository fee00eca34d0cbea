// Pre-tokenizer: splits normalised text into pieces with the regex named by the vocabulary's `pre`
// (GGUF tokenizer.ggml.pre). Every byte of the input lands in exactly one piece, in order: regex
// matches are pieces and any text between matches is a piece too (HF Split behaviour "Isolated").
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai {

// Pre-tokenizer names we know, with the regex as the model's tokenizer.json spells it (HF / Oniguruma
// syntax). `qwen35` is Qwen3.5's (combining marks \p{M} join letters); `qwen2` is Qwen2/Qwen3's.
struct PreTokenizerSpec {
  const char* name;
  const char* hf_regex;
};
const std::vector<PreTokenizerSpec>& known_pretokenizers();
// "qwen35, qwen2"
std::string known_pretokenizer_names();
// The HF regex of a known name; throws bonsai::Error listing the known names otherwise.
const char* pretokenizer_hf_regex(std::string_view name);
// The name whose HF regex is exactly `regex`, or "" when none.
std::string pretokenizer_name_for_regex(std::string_view regex);

class PreTokenizer {
 public:
  // Throws bonsai::Error "unknown pre-tokenizer '<name>' (known: qwen35, qwen2)".
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  const std::string& name() const { return name_; }
  bool jit() const;  // whether the PCRE2 JIT compiled the pattern

  // Appends the pieces of `text` (valid UTF-8) to `out`, as views into `text`. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  std::vector<std::string> split(std::string_view text) const;

 private:
  struct Impl;
  std::string name_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bonsai
