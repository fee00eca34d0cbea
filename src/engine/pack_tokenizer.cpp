#include "engine/pack_tokenizer.h"

#include "tokenizer/gguf_vocabulary.h"
#include "tokenizer/hf_tokenizer_json.h"

namespace bonsai {

std::unique_ptr<Tokenizer> load_pack_tokenizer(const Pack& pack) {
  if (pack.gguf) {
    if (!pack.gguf->has("tokenizer.ggml.tokens")) return nullptr;
    return std::make_unique<Tokenizer>(vocabulary_from_gguf(*pack.gguf));
  }
  if (pack.mlx) {
    if (!pack.mlx->has_file("tokenizer.json")) return nullptr;
    return std::make_unique<Tokenizer>(vocabulary_from_hf_dir(pack.mlx->dir()));
  }
  return nullptr;
}

}  // namespace bonsai
