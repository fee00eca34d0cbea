// UTF-8 helpers for the tokenizer: validation with the offending offset, lossy repair, and the
// incremental scanner the StreamingDecoder uses.
//
// Replacement policy everywhere (decode, StreamingDecoder, sanitize_utf8): each *maximal subpart* of an
// ill-formed sequence becomes one U+FFFD (Unicode 15 section 3.9, "U+FFFD substitution of maximal
// subparts"). That is what Python's bytes.decode("utf-8", "replace"), Rust's String::from_utf8_lossy (HF
// tokenizers' ByteLevel decoder) and WHATWG encoding do, so our output matches theirs byte for byte.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bonsai::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence at s[0..n), or 0 when s[0..n) starts with an ill-formed sequence,
// or -k (k >= 1) when the n bytes are a valid but incomplete prefix of a sequence (need more bytes).
// `bad_len` gets the maximal-subpart length when 0 is returned.
int sequence_length(const uint8_t* s, size_t n, size_t* bad_len);

// Offset of the first byte that does not start a well-formed sequence (an incomplete sequence at the end
// counts as ill-formed), or nullopt when all of `s` is valid UTF-8.
std::optional<size_t> first_invalid(std::string_view s);

// Appends `s` to `out` with every maximal ill-formed subpart replaced by U+FFFD. When `final` is false,
// a valid-but-incomplete sequence at the very end is not emitted: its length is returned so the caller
// can keep those bytes for later. Returns 0 when everything was consumed.
size_t append_lossy(std::string_view s, std::string& out, bool final);

// append_lossy(s, final=true) into a fresh string.
std::string sanitize(std::string_view s);

// Decodes one code point at s[i] (the input must be valid UTF-8) and advances i.
inline uint32_t next_cp(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  uint32_t c = p[0];
  if (c < 0x80) { i += 1; return c; }
  if (c < 0xE0) { i += 2; return ((c & 0x1F) << 6) | (p[1] & 0x3F); }
  if (c < 0xF0) { i += 3; return ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F); }
  i += 4;
  return ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void append_cp(std::string& out, uint32_t cp);

}  // namespace bonsai::utf8
