// HuggingFace tokenizer files <-> Vocabulary.
//
// Read: tokenizer.json with model.type "BPE" (vocab, merges as "a b" strings or [a, b] pairs,
// ignore_merges), added_tokens (special -> Control, otherwise UserDefined), and the pre-tokenizer's Split
// regex, which must be exactly one of the known ones (qwen35 / qwen2). Ids missing from both vocab and
// added_tokens become Unused "[PAD<id>]" rows. eos/bos/pad come from tokenizer_config.json (and stop ids
// from generation_config.json) when read through vocabulary_from_hf_dir.
//
// Write: a tokenizer.json HF `tokenizers` loads (NFC normaliser, Sequence[Split(regex, Isolated),
// ByteLevel(add_prefix_space=false, use_regex=false)], BPE without byte fallback, ByteLevel decoder,
// added_tokens), and a Qwen-style tokenizer_config.json. Unused rows are not written.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "tokenizer/vocabulary.h"

namespace bonsai {

Vocabulary vocabulary_from_tokenizer_json(const std::string& path);
Vocabulary vocabulary_from_tokenizer_json(const nlohmann::json& j, std::string_view what);
Vocabulary vocabulary_from_tokenizer_json_text(std::string_view text, std::string_view what);

// Sets eos_id / pad_id / bos_id / add_bos from a tokenizer_config.json (eos_token, pad_token,
// bos_token as strings or {"content": ...}, add_bos_token).
void apply_tokenizer_config(Vocabulary& v, const nlohmann::json& config, std::string_view what);
// tokenizer.json + optional tokenizer_config.json + optional generation_config.json (eos_token_id: int
// or list -> extra_eos_ids) from an HF / MLX model folder.
Vocabulary vocabulary_from_hf_dir(const std::string& dir);

nlohmann::json tokenizer_json(const Vocabulary& v);
void write_tokenizer_json(const Vocabulary& v, const std::string& path);
// chat_template is written only when non-empty (Qwen3.5 folders ship chat_template.jinja instead).
nlohmann::json tokenizer_config_json(const Vocabulary& v, const std::string& chat_template = {});
void write_tokenizer_config_json(const Vocabulary& v, const std::string& path, const std::string& chat_template = {});

}  // namespace bonsai
