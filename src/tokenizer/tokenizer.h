// Byte-level BPE tokenizer (GPT-2 / Qwen style), HF `tokenizers` semantics:
//
// encode(text):
//  1. The input must be valid UTF-8: otherwise bonsai::Error naming the byte offset and value. (HF only
//     accepts str, which cannot hold invalid UTF-8; callers with untrusted bytes use
//     utf8::sanitize(), which replaces bad bytes with U+FFFD exactly as Python's
//     bytes.decode("utf-8", "replace") does, and then encode.)
//  2. Added tokens are found first, on the raw text, leftmost-longest: UserDefined tokens (<think>,
//     <tool_call>, ...) always; Control tokens (<|im_start|>, ...) only with parse_special = true,
//     otherwise their text is tokenised as plain text (HF's encode_special_tokens = true, llama.cpp's
//     parse_special = false).
//  3. Each stretch of text between added tokens is NFC-normalised, split by the pre-tokenizer regex, and
//     each piece's bytes are merged by BPE: repeatedly the adjacent pair with the lowest merge rank,
//     leftmost on ties, until no pair has a merge. No BOS is added, there is no unknown token.
//
// decode(ids) returns the raw bytes (may end inside a UTF-8 sequence); StreamingDecoder turns ids into
// text incrementally. A Tokenizer is immutable after construction and safe to use from many threads.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocabulary.h"

namespace bonsai {

class Tokenizer {
 public:
  // Validates the vocabulary and builds the lookup tables; throws bonsai::Error with context (e.g. an
  // unknown `pre` lists the known names, a merge naming a missing token gives its index).
  explicit Tokenizer(Vocabulary vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  const Vocabulary& vocab() const { return vocab_; }
  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.tokens.size()); }

  std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const;
  // Appends to `out`.
  void encode(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;

  // Concatenated raw bytes of the tokens. Control tokens are skipped when skip_special is true; Unused
  // tokens decode to nothing; an id outside [0, n_vocab) throws bonsai::Error.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Raw bytes of one token ("" for Unused).
  const std::string& token_bytes(int32_t id) const;
  // Id of the Normal token whose raw bytes are `bytes`, or of the added token with that text; -1 if none.
  int32_t token_id(std::string_view bytes) const;
  bool is_control(int32_t id) const;

  // Pieces after added-token splitting, NFC and the pre-tokenizer (tests, debugging).
  std::vector<std::string> pretokenize(std::string_view text, bool parse_special = false) const;

 private:
  struct Impl;
  Vocabulary vocab_;
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer: push ids one at a time and get back only complete UTF-8 text.
//  - Bytes that may still become a valid character are held back (at most 3) until the next push.
//  - Ill-formed bytes are emitted as U+FFFD, one per maximal subpart, as soon as they are known to be bad.
//  - flush() emits whatever is held back; an incomplete trailing sequence becomes one U+FFFD.
// The concatenation of all push() results and flush() equals utf8::sanitize(tokenizer.decode(ids)), so
// the output is always valid UTF-8 and never ends in half a character.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);
  void push(int32_t id, std::string& out);  // appends
  std::string flush();
  void reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace bonsai
