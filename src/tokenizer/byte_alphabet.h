// GPT-2's byte <-> unicode alphabet. Byte-level BPE vocabularies (GGUF tokenizer.ggml.tokens, HF
// tokenizer.json model.vocab / merges) spell each byte as one printable code point so that tokens are
// valid text: the bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other 68 bytes
// (controls, space, DEL, 0x80..0xA0, 0xAD) take U+0100.. in byte order (space -> U+0120 'Ġ', '\n' -> 'Ċ').
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bonsai {

uint32_t byte_to_alphabet_cp(uint8_t b);
// Bytes -> byte-alphabet UTF-8 text.
std::string bytes_to_alphabet(std::string_view bytes);
// Byte-alphabet UTF-8 text -> bytes; nullopt when the text is not valid UTF-8 or holds a code point
// outside the alphabet.
std::optional<std::string> alphabet_to_bytes(std::string_view text);

}  // namespace bonsai
