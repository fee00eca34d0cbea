// GGUF tokenizer metadata <-> Vocabulary (llama.cpp's keys, as the real Bonsai 2 packs carry them).
//
// Read: tokenizer.ggml.model must be "gpt2" (byte-level BPE); tokenizer.ggml.tokens (str[]),
// tokenizer.ggml.token_type (i32[], same length; absent = all Normal), tokenizer.ggml.merges (str[]),
// tokenizer.ggml.pre (str, required: no default is guessed), eos_token_id (required), bos_token_id / padding_token_id / eot_token_id / add_bos_token (optional).
// Every problem is a bonsai::Error naming the file and the key.
#pragma once
#include "tokenizer/vocabulary.h"

namespace bonsai {

class GgufFile;
class GgufWriter;

Vocabulary vocabulary_from_gguf(const GgufFile& f);
// Sets the tokenizer.ggml.* keys above on a writer (not tokenizer.chat_template: the pack's business).
void add_vocabulary_to_gguf(GgufWriter& w, const Vocabulary& v);

}  // namespace bonsai
