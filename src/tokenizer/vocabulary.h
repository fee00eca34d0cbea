// Vocabulary: everything a byte-level BPE tokenizer needs, in the form GGUF and HF tokenizer.json store
// it. Loaders (GGUF, tokenizer.json, the tiny trainer) produce one; Tokenizer is built from one.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai {

// GGUF tokenizer.ggml.token_type values (llama.cpp's numbering).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,       // a BPE token, spelled in the GPT-2 byte alphabet
  Unknown = 2,
  Control = 3,      // special token (HF added token with special=true): <|im_start|>, <|endoftext|>, ...
  UserDefined = 4,  // added token that is not special (HF special=false): <think>, <tool_call>, ...
  Unused = 5,       // padding rows ([PAD248077] ...): never produced by encode, decode to nothing
  Byte = 6,
};
const char* token_type_name(int32_t type);

struct Vocabulary {
  // [n_vocab] Normal tokens in GPT-2 byte-alphabet form (space = "Ġ"); Control / UserDefined tokens as
  // their raw UTF-8 text (what is matched in input and emitted on decode). Both are how GGUF and
  // tokenizer.json store them.
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // [n_vocab] TokenType values
  std::vector<std::string> merges;   // "a b" (byte-alphabet halves), highest priority first
  std::string pre = "qwen35";        // pre-tokenizer name (tokenizer.ggml.pre)
  // HF BPE ignore_merges: a whole pre-token that is itself a vocabulary token maps to it directly. Qwen's
  // tokenizer.json files say false; GGUF has no such key (false).
  bool ignore_merges = false;
  int32_t eos_id = -1;                  // tokenizer.ggml.eos_token_id (-1: none)
  std::optional<int32_t> bos_id;        // tokenizer.ggml.bos_token_id
  std::optional<int32_t> pad_id;        // tokenizer.ggml.padding_token_id
  std::optional<int32_t> eot_id;        // tokenizer.ggml.eot_token_id
  bool add_bos = false;                 // tokenizer.ggml.add_bos_token (Qwen: false)
  std::vector<int32_t> extra_eos_ids;   // more stop ids (HF generation_config.json eos_token_id list)

  size_t size() const { return tokens.size(); }
  bool is_added(int32_t id) const;      // Control or UserDefined
  // Ids generation stops on, deduplicated, in this order: eos, eot, extra_eos_ids, then any Control token
  // spelled <|im_end|> or <|endoftext|> (llama.cpp's end-of-generation rule: Qwen GGUFs carry only one
  // eos id, but Qwen stops on both).
  std::vector<int32_t> stop_ids() const;
  // First id whose stored token string equals `token` (linear scan; for setup code, not hot paths).
  std::optional<int32_t> find(std::string_view token) const;
  // Structural checks (sizes agree, ids in range, types known, merges well-formed). Throws bonsai::Error
  // prefixed with `what` (a file name).
  void validate(std::string_view what) const;
};

// Qwen3.5's 33 added tokens in id order from <|endoftext|> (248044 in the real vocabulary), with
// special=true/false as Qwen's tokenizer_config.json marks them (tool/think/fim tokens are not special).
struct AddedTokenSpec {
  const char* text;
  bool special;
};
const std::vector<AddedTokenSpec>& qwen35_added_tokens();
std::vector<std::string> qwen35_added_token_texts();

// Appends Unused "[PAD<id>]" rows until the vocabulary has n tokens (models pad the embedding table;
// Qwen3.5 has 248,320 rows for 248,077 tokens). No-op when it already has n or more.
void pad_vocabulary(Vocabulary& v, size_t n);

}  // namespace bonsai
