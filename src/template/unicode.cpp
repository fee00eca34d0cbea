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

namespace {

struct CpRange {
  char32_t first, last;
};
struct CaseRun {
  char32_t first, last;
  int stride, delta;
};
struct CaseSpecial {
  char32_t cp;
  char32_t seq[3];
};

#include "template/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CpRange (&t)[N], char32_t c) {
  size_t lo = 0, hi = N;
  while (lo < hi) {  // first range with last >= c
    size_t mid = (lo + hi) / 2;
    if (t[mid].last < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < N && t[lo].first <= c;
}

// Appends the case mapping of c (specials first, then runs); returns false when c maps to itself.
template <size_t NR, size_t NS>
bool map_case(const CaseRun (&runs)[NR], const CaseSpecial (&specials)[NS], char32_t c, std::u32string* out) {
  size_t lo = 0, hi = NS;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (specials[mid].cp < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < NS && specials[lo].cp == c) {
    if (out)
      for (char32_t x : specials[lo].seq)
        if (x) out->push_back(x);
    return true;
  }
  lo = 0;
  hi = NR;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (runs[mid].last < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < NR && runs[lo].first <= c && (c - runs[lo].first) % static_cast<char32_t>(runs[lo].stride) == 0) {
    if (out) out->push_back(static_cast<char32_t>(static_cast<int64_t>(c) + runs[lo].delta));
    return true;
  }
  return false;
}

}  // namespace

bool is_space(char32_t c) {
  if (c < 0x80) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return in_ranges(kSpace, c);
}

bool is_linebreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool is_printable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  return in_ranges(kPrintable, c);
}

bool is_digit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kDigit, c);
}

bool is_decimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kDecimal, c);
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kNumeric, c);
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return in_ranges(kAlpha, c);
}

bool is_alnum(char32_t c) { return is_alpha(c) || is_decimal(c) || is_digit(c) || is_numeric(c); }

bool is_word(char32_t c) { return c == '_' || is_alnum(c); }

bool is_cased(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return in_ranges(kCased, c);
}

bool is_case_ignorable(char32_t c) { return in_ranges(kCaseIgnorable, c); }

bool is_upper(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  return in_ranges(kUpper, c);
}

bool is_lower(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  return in_ranges(kLower, c);
}

bool is_title(char32_t c) { return c >= 0x80 && is_cased(c) && !is_upper(c) && !is_lower(c); }

void to_upper(char32_t c, std::u32string& out) {
  if (c < 0x80) {
    out.push_back((c >= 'a' && c <= 'z') ? c - 32 : c);
    return;
  }
  if (!map_case(kUpperRuns, kUpperSpecial, c, &out)) out.push_back(c);
}

void to_lower(char32_t c, std::u32string& out) {
  if (c < 0x80) {
    out.push_back((c >= 'A' && c <= 'Z') ? c + 32 : c);
    return;
  }
  if (!map_case(kLowerRuns, kLowerSpecial, c, &out)) out.push_back(c);
}

void to_title(char32_t c, std::u32string& out) {
  if (c < 0x80) {
    out.push_back((c >= 'a' && c <= 'z') ? c - 32 : c);
    return;
  }
  if (!map_case(kTitleRuns, kTitleSpecial, c, &out)) out.push_back(c);
}

namespace {
// CPython's handle_capital_sigma: U+03A3 lowercases to final sigma U+03C2 when preceded by a cased
// letter and not followed by one (case-ignorable characters skipped both ways).
char32_t lower_sigma(const std::u32string& s, size_t i) {
  size_t j = i;
  char32_t c = 0;
  bool found = false;
  while (j-- > 0) {
    c = s[j];
    if (!is_case_ignorable(c)) {
      found = true;
      break;
    }
  }
  bool final_sigma = found && is_cased(c);
  if (final_sigma && i + 1 < s.size()) {
    size_t k = i + 1;
    for (; k < s.size(); ++k)
      if (!is_case_ignorable(s[k])) break;
    final_sigma = k == s.size() || !is_cased(s[k]);
  }
  return final_sigma ? 0x3C2 : 0x3C3;
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
