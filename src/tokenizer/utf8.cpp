#include "tokenizer/utf8.h"

#include <cstring>

namespace bonsai::utf8 {

int sequence_length(const uint8_t* s, size_t n, size_t* bad_len) {
  const uint8_t b0 = s[0];
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    *bad_len = 1;
    return 0;
  }
  for (int k = 1; k < need; ++k) {
    if (static_cast<size_t>(k) >= n) return -k;  // valid so far, truncated
    const uint8_t b = s[k];
    const bool ok = (k == 1) ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *bad_len = static_cast<size_t>(k);  // the valid prefix is the maximal subpart
      return 0;
    }
  }
  return need;
}

std::optional<size_t> first_invalid(std::string_view sv) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) { ++i; continue; }
    size_t bad = 0;
    const int len = sequence_length(s + i, n - i, &bad);
    if (len <= 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::nullopt;
}

size_t append_lossy(std::string_view sv, std::string& out, bool final) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0, run = 0;  // [run, i) is a pending stretch of valid bytes
  while (i < n) {
    if (s[i] < 0x80) { ++i; continue; }
    size_t bad = 0;
    const int len = sequence_length(s + i, n - i, &bad);
    if (len > 0) { i += static_cast<size_t>(len); continue; }
    out.append(sv.data() + run, i - run);
    if (len < 0) {  // incomplete at the very end
      if (!final) return n - i;
      out.append(kReplacement);
      return 0;
    }
    out.append(kReplacement);
    i += bad;
    run = i;
  }
  out.append(sv.data() + run, n - run);
  return 0;
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_lossy(s, out, true);
  return out;
}

void append_cp(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace bonsai::utf8
