#include "tokenizer/byte_alphabet.h"

#include <array>

#include "tokenizer/utf8.h"

namespace bonsai {
namespace {

struct Alphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points used are < 0x144 (256 + 68)
  Alphabet() {
    from_cp.fill(-1);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = self ? b : 256 + extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

uint32_t byte_to_alphabet_cp(uint8_t b) { return alphabet().to_cp[b]; }

std::string bytes_to_alphabet(std::string_view bytes) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append_cp(out, a.to_cp[static_cast<uint8_t>(c)]);
  return out;
}

std::optional<std::string> alphabet_to_bytes(std::string_view text) {
  if (utf8::first_invalid(text)) return std::nullopt;
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const uint32_t cp = utf8::next_cp(text, i);
    if (cp >= a.from_cp.size() || a.from_cp[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(a.from_cp[cp]));
  }
  return out;
}

}  // namespace bonsai
