#include "tokenizer/gguf_vocabulary.h"

#include "format/gguf.h"
#include "util/error.h"

namespace bonsai {

Vocabulary vocabulary_from_gguf(const GgufFile& f) {
  const std::string& path = f.path();
  const std::string model = f.get_str("tokenizer.ggml.model");
  if (model != "gpt2")
    fail("{}: key 'tokenizer.ggml.model' is '{}', expected 'gpt2' (byte-level BPE)", path, model);
  Vocabulary v;
  v.tokens = f.get_arr_str("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_arr_int("tokenizer.ggml.token_type");
    if (types.size() != v.tokens.size())
      fail("{}: key 'tokenizer.ggml.token_type' has {} entries, expected {} (one per token)", path, types.size(),
           v.tokens.size());
    v.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < 0 || types[i] > 6)
        fail("{}: key 'tokenizer.ggml.token_type'[{}] = {} is not a known token type", path, i, types[i]);
      v.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  } else {
    v.token_types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::Normal));
  }
  v.merges = f.get_arr_str("tokenizer.ggml.merges");
  v.pre = f.get_str("tokenizer.ggml.pre");
  const int64_t n = static_cast<int64_t>(v.tokens.size());
  auto id_key = [&](const char* key) -> std::optional<int32_t> {
    if (!f.has(key)) return std::nullopt;
    const int64_t id = f.get_i64(key);
    if (id < 0 || id >= n) fail("{}: key '{}' = {} is outside the vocabulary (size {})", path, key, id, n);
    return static_cast<int32_t>(id);
  };
  const auto eos = id_key("tokenizer.ggml.eos_token_id");
  if (!eos) fail("{}: key 'tokenizer.ggml.eos_token_id' is missing", path);
  v.eos_id = *eos;
  v.bos_id = id_key("tokenizer.ggml.bos_token_id");
  v.pad_id = id_key("tokenizer.ggml.padding_token_id");
  v.eot_id = id_key("tokenizer.ggml.eot_token_id");
  if (auto b = f.opt_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  v.validate(path);
  return v;
}

void add_vocabulary_to_gguf(GgufWriter& w, const Vocabulary& v) {
  v.validate("add_vocabulary_to_gguf");
  w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::str(v.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::arr_str(v.tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::arr_i32(v.token_types));
  w.set("tokenizer.ggml.merges", GgufValue::arr_str(v.merges));
  if (v.eos_id >= 0) w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(v.eos_id)));
  if (v.bos_id) w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(*v.bos_id)));
  if (v.pad_id) w.set("tokenizer.ggml.padding_token_id", GgufValue::u32(static_cast<uint32_t>(*v.pad_id)));
  if (v.eot_id) w.set("tokenizer.ggml.eot_token_id", GgufValue::u32(static_cast<uint32_t>(*v.eot_id)));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(v.add_bos));
}

}  // namespace bonsai
