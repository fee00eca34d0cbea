// The tokenizer a pack carries: GGUF tokenizer.ggml.* keys, or the MLX folder's tokenizer.json (+
// tokenizer_config.json / generation_config.json). Packs without one still run on token ids.
#pragma once
#include <memory>

#include "model/pack.h"
#include "tokenizer/tokenizer.h"

namespace bonsai {

// nullptr when the pack has no tokenizer; throws bonsai::Error when it has a broken one.
std::unique_ptr<Tokenizer> load_pack_tokenizer(const Pack& pack);

}  // namespace bonsai
