#include "template/unicode.h"

namespace bonsai::tpl::uni {

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    if (i + len > n) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

char32_t next_cp(std::string_view s, size_t& pos) {
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) {
    ++pos;
    return c;
  }
  int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || pos + static_cast<size_t>(len) > s.size()) {
    ++pos;
    return 0xFFFD;
  }
  char32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len; ++k) {
    unsigned char cc = static_cast<unsigned char>(s[pos + static_cast<size_t>(k)]);
    if ((cc & 0xC0) != 0x80) {
      ++pos;
      return 0xFFFD;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  pos += static_cast<size_t>(len);
  return cp;
}

char32_t prev_cp(std::string_view s, size_t& pos) {
  size_t start = pos - 1;
  while (start > 0 && pos - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t p = start;
  char32_t cp = next_cp(s, p);
  if (p != pos) {  // malformed: step back one byte
    pos -= 1;
    return 0xFFFD;
  }
  pos = start;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

bool is_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_linebreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool is_printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c >= 0x80 && c <= 0xA0) return false;
  if (c == 0xAD || c == 0x061C || c == 0x1680 || c == 0x180E) return false;
  if (c >= 0x2000 && c <= 0x200F) return false;
  if (c >= 0x2028 && c <= 0x202F) return false;
  if (c >= 0x205F && c <= 0x206F) return false;
  if (c == 0x3000 || c == 0xFEFF) return false;
  if (c >= 0xD800 && c <= 0xF8FF) return false;  // surrogates + private use
  if (c >= 0xFFF0 && c <= 0xFFFB) return false;
  if (c == 0xFFFE || c == 0xFFFF) return false;
  if (c >= 0xE0000 && c <= 0xE007F) return false;
  if (c >= 0xF0000) return false;
  return true;
}

bool is_digit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  if (c == 0xB2 || c == 0xB3 || c == 0xB9) return true;
  static const char32_t zeros[] = {0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6,
                                   0xC66, 0xCE6, 0xD66, 0xE50, 0xED0, 0xF20, 0x1040, 0xFF10};
  for (char32_t z : zeros)
    if (c >= z && c <= z + 9) return true;
  if (c >= 0x2070 && c <= 0x2079 && c != 0x2071 && c != 0x2072 && c != 0x2073) return true;
  if (c >= 0x2080 && c <= 0x2089) return true;
  if (c >= 0x2460 && c <= 0x2468) return true;
  return false;
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (c == 0xAA || c == 0xBA) return true;
  if (is_cased(c)) return true;
  if (c >= 0xC0 && c <= 0x24F) return c != 0xD7 && c != 0xF7;
  if (c >= 0x250 && c <= 0x2C1) return true;
  if (c >= 0x370 && c <= 0x3FF) return c != 0x37E && c != 0x387 && c != 0x375;
  if (c >= 0x400 && c <= 0x481) return true;
  if (c >= 0x48A && c <= 0x52F) return true;
  if (c >= 0x5D0 && c <= 0x5EA) return true;
  if (c >= 0x620 && c <= 0x64A) return true;
  if (c >= 0x671 && c <= 0x6D3) return true;
  if (c >= 0x904 && c <= 0x939) return true;
  if (c >= 0xE01 && c <= 0xE30) return true;
  if (c >= 0x1100 && c <= 0x11FF) return true;
  if (c >= 0x3041 && c <= 0x3096) return true;
  if (c >= 0x30A1 && c <= 0x30FA) return true;
  if (c >= 0x3400 && c <= 0x4DBF) return true;
  if (c >= 0x4E00 && c <= 0x9FFF) return true;
  if (c >= 0xAC00 && c <= 0xD7A3) return true;
  if (c >= 0xF900 && c <= 0xFAFF) return true;
  if (c >= 0x20000 && c <= 0x3134F) return true;
  return false;
}

bool is_alnum(char32_t c) { return is_alpha(c) || is_digit(c); }

bool is_word(char32_t c) {
  if (c == '_') return true;
  if (is_alnum(c)) return true;
  if (c >= 0x300 && c <= 0x36F) return true;  // combining marks
  return false;
}

char32_t simple_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c < 0x100) return (c >= 0xC0 && c <= 0xDE && c != 0xD7) ? c + 32 : c;
  if (c < 0x180) {
    if (c == 0x130) return 'i';
    if (c == 0x178) return 0xFF;
    if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
      return (c % 2 == 0) ? c + 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
    return c;
  }
  if (c < 0x250) {
    if (c == 0x1C4 || c == 0x1C7 || c == 0x1CA || c == 0x1F1) return c + 2;
    if (c == 0x1C5 || c == 0x1C8 || c == 0x1CB || c == 0x1F2) return c + 1;
    if (c >= 0x1CD && c <= 0x1DC) return (c % 2 == 1) ? c + 1 : c;
    if ((c >= 0x1DE && c <= 0x1EF) || (c >= 0x1F8 && c <= 0x21F) || (c >= 0x222 && c <= 0x233) ||
        (c >= 0x246 && c <= 0x24F))
      return (c % 2 == 0) ? c + 1 : c;
    if (c == 0x1F4) return 0x1F5;
    return c;
  }
  if (c >= 0x370 && c < 0x400) {
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 32;
    return c;
  }
  if (c >= 0x400 && c < 0x530) {
    if (c <= 0x40F) return c + 80;
    if (c <= 0x42F) return c + 32;
    if (c == 0x4C0) return 0x4CF;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
      return (c % 2 == 0) ? c + 1 : c;
    if (c >= 0x4C1 && c <= 0x4CE) return (c % 2 == 1) ? c + 1 : c;
    return c;
  }
  if (c >= 0x531 && c <= 0x556) return c + 48;
  if (c >= 0x1E00 && c <= 0x1EFF) {
    if (c == 0x1E9E) return 0xDF;
    if ((c <= 0x1E95) || (c >= 0x1EA0)) return (c % 2 == 0) ? c + 1 : c;
    return c;
  }
  if (c >= 0x2160 && c <= 0x216F) return c + 16;
  if (c >= 0x24B6 && c <= 0x24CF) return c + 26;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

char32_t simple_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c < 0x100) {
    if (c == 0xB5) return 0x39C;
    if (c == 0xFF) return 0x178;
    return (c >= 0xE0 && c <= 0xFE && c != 0xF7) ? c - 32 : c;
  }
  if (c < 0x180) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    if ((c >= 0x101 && c <= 0x12F) || (c >= 0x133 && c <= 0x137) || (c >= 0x14B && c <= 0x177))
      return (c % 2 == 1) ? c - 1 : c;
    if ((c >= 0x13A && c <= 0x148) || (c >= 0x17A && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
    return c;
  }
  if (c < 0x250) {
    if (c == 0x1C6 || c == 0x1C9 || c == 0x1CC || c == 0x1F3) return c - 2;
    if (c == 0x1C5 || c == 0x1C8 || c == 0x1CB || c == 0x1F2) return c - 1;
    if (c >= 0x1CE && c <= 0x1DC) return (c % 2 == 0) ? c - 1 : c;
    if ((c >= 0x1DF && c <= 0x1EF) || (c >= 0x1F9 && c <= 0x21F) || (c >= 0x223 && c <= 0x233) ||
        (c >= 0x247 && c <= 0x24F))
      return (c % 2 == 1) ? c - 1 : c;
    if (c == 0x1F5) return 0x1F4;
    return c;
  }
  if (c >= 0x370 && c < 0x400) {
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3C2) return 0x3A3;
    if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 32;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    return c;
  }
  if (c >= 0x400 && c < 0x530) {
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (c == 0x4CF) return 0x4C0;
    if ((c >= 0x461 && c <= 0x481) || (c >= 0x48B && c <= 0x4BF) || (c >= 0x4D1 && c <= 0x52F))
      return (c % 2 == 1) ? c - 1 : c;
    if (c >= 0x4C2 && c <= 0x4CE) return (c % 2 == 0) ? c - 1 : c;
    return c;
  }
  if (c >= 0x561 && c <= 0x586) return c - 48;
  if (c >= 0x1E00 && c <= 0x1EFF) {
    if ((c <= 0x1E95) || (c >= 0x1EA0)) return (c % 2 == 1) ? c - 1 : c;
    return c;
  }
  if (c >= 0x2170 && c <= 0x217F) return c - 16;
  if (c >= 0x24D0 && c <= 0x24E9) return c - 26;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

namespace {
// Ligatures U+FB00..U+FB06 upper-case to several letters.
const char* ligature_upper(char32_t c) {
  switch (c) {
    case 0xFB00: return "FF";
    case 0xFB01: return "FI";
    case 0xFB02: return "FL";
    case 0xFB03: return "FFI";
    case 0xFB04: return "FFL";
    case 0xFB05:
    case 0xFB06: return "ST";
    default: return nullptr;
  }
}
}  // namespace

bool is_cased(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (c == 0xDF || c == 0x149 || c == 0x138 || c == 0xAA || c == 0xBA) return true;
  if (c >= 0xFB00 && c <= 0xFB06) return true;
  return simple_upper(c) != c || simple_lower(c) != c;
}

bool is_upper(char32_t c) { return simple_lower(c) != c; }

bool is_lower(char32_t c) {
  if (c == 0xDF || c == 0x149 || c == 0x138 || (c >= 0xFB00 && c <= 0xFB06)) return true;
  return simple_upper(c) != c;
}

void to_upper(char32_t c, std::u32string& out) {
  if (c == 0xDF) {
    out += U"SS";
    return;
  }
  if (c == 0x149) {
    out.push_back(0x2BC);
    out.push_back('N');
    return;
  }
  if (const char* l = ligature_upper(c)) {
    for (const char* p = l; *p; ++p) out.push_back(static_cast<char32_t>(*p));
    return;
  }
  out.push_back(simple_upper(c));
}

void to_lower(char32_t c, std::u32string& out) {
  if (c == 0x130) {
    out.push_back('i');
    out.push_back(0x307);
    return;
  }
  out.push_back(simple_lower(c));
}

void to_title(char32_t c, std::u32string& out) {
  if (c >= 0x1C4 && c <= 0x1CC) {
    out.push_back(c <= 0x1C6 ? 0x1C5 : c <= 0x1C9 ? 0x1C8 : 0x1CB);
    return;
  }
  if (c >= 0x1F1 && c <= 0x1F3) {
    out.push_back(0x1F2);
    return;
  }
  if (c == 0xDF) {
    out += U"Ss";
    return;
  }
  if (c == 0x149) {
    out.push_back(0x2BC);
    out.push_back('N');
    return;
  }
  if (const char* l = ligature_upper(c)) {
    out.push_back(static_cast<char32_t>(l[0]));
    for (const char* p = l + 1; *p; ++p) out.push_back(static_cast<char32_t>(*p + 32));
    return;
  }
  out.push_back(simple_upper(c));
}

namespace {
// Python's final-sigma rule: capital sigma lowercases to U+03C2 when it ends a word.
char32_t lower_sigma(const std::u32string& s, size_t i) {
  bool before = false;
  for (size_t j = i; j-- > 0;) {
    if (s[j] == '\'' || (s[j] >= 0x300 && s[j] <= 0x36F)) continue;
    before = is_cased(s[j]);
    break;
  }
  if (!before) return 0x3C3;
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (s[j] == '\'' || (s[j] >= 0x300 && s[j] <= 0x36F)) continue;
    return is_cased(s[j]) ? 0x3C3 : 0x3C2;
  }
  return 0x3C2;
}

void lower_at(const std::u32string& s, size_t i, std::u32string& out) {
  if (s[i] == 0x3A3)
    out.push_back(lower_sigma(s, i));
  else
    to_lower(s[i], out);
}
}  // namespace

std::string upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string r(s);
    for (char& c : r)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return r;
  }
  std::u32string in = decode(s), out;
  for (char32_t c : in) to_upper(c, out);
  return encode(out);
}

std::string lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string r(s);
    for (char& c : r)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return r;
  }
  std::u32string in = decode(s), out;
  for (size_t i = 0; i < in.size(); ++i) lower_at(in, i, out);
  return encode(out);
}

std::string title(std::string_view s) {
  std::u32string in = decode(s), out;
  bool prev_cased = false;
  for (size_t i = 0; i < in.size(); ++i) {
    if (prev_cased)
      lower_at(in, i, out);
    else
      to_title(in[i], out);
    prev_cased = is_cased(in[i]);
  }
  return encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string in = decode(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0)
      to_title(in[i], out);
    else
      lower_at(in, i, out);
  }
  return encode(out);
}

std::string swapcase(std::string_view s) {
  std::u32string in = decode(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    char32_t c = in[i];
    if (is_upper(c))
      lower_at(in, i, out);
    else if (is_lower(c))
      to_upper(c, out);
    else
      out.push_back(c);
  }
  return encode(out);
}

}  // namespace bonsai::tpl::uni
