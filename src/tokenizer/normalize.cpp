#include "tokenizer/normalize.h"

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace bonsai {
namespace {

// A code point is NFC-inert when any string made only of inert code points is its own NFC:
//  - canonical combining class 0 (it never reorders and never blocks differently),
//  - NFC(cp) == cp on its own (no singleton / excluded decomposition),
//  - it is not a non-first element of any canonical decomposition (so it can never compose with what
//    precedes it: this covers Hangul V/T jamo, Indic two-part vowels, ...),
//  - if it decomposes, its decomposition does not start with such a "second" element.
// Under these rules NFD(s) is the concatenation of each NFD(cp) whose boundaries hold a starter that
// cannot compose backwards, so recomposition gives each cp back. The table is built once per process from
// utf8proc (the same Unicode version the slow path uses) for code points below kLimit; anything above is
// treated as not inert (rare planes take the slow path).
constexpr uint32_t kLimit = 0x30000;

struct InertTable {
  std::vector<uint64_t> bits;  // [kLimit / 64], bit set = inert
  InertTable() : bits(kLimit / 64, 0) {
    std::vector<uint8_t> second(kLimit, 0), decomposes(kLimit, 0);
    std::vector<uint32_t> first_elem(kLimit, 0);
    utf8proc_int32_t buf[32];
    for (uint32_t cp = 0; cp < kLimit; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      int boundclass = 0;
      const utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 32,
                                                         UTF8PROC_DECOMPOSE, &boundclass);
      if (n <= 0) continue;
      if (n == 1 && static_cast<uint32_t>(buf[0]) == cp) continue;
      decomposes[cp] = 1;
      first_elem[cp] = static_cast<uint32_t>(buf[0]);
      for (utf8proc_ssize_t k = 1; k < n; ++k)
        if (static_cast<uint32_t>(buf[k]) < kLimit) second[static_cast<uint32_t>(buf[k])] = 1;
    }
    for (uint32_t cp = 0; cp < kLimit; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      if (second[cp]) continue;
      if (utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class != 0) continue;
      if (decomposes[cp]) {
        if (first_elem[cp] < kLimit && second[first_elem[cp]]) continue;
        std::string one;
        utf8::append_cp(one, cp);
        utf8proc_uint8_t* r = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(one.c_str()));
        const bool same = r && std::strcmp(reinterpret_cast<const char*>(r), one.c_str()) == 0;
        std::free(r);
        if (!same) continue;
      }
      bits[cp >> 6] |= uint64_t{1} << (cp & 63);
    }
  }
  bool inert(uint32_t cp) const { return cp < kLimit && ((bits[cp >> 6] >> (cp & 63)) & 1); }
};

const InertTable& inert_table() {
  static const InertTable t;
  return t;
}

}  // namespace

bool nfc_quick_check(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  const InertTable* t = nullptr;
  while (i < n) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) { ++i; continue; }
    if (c < 0xCC) { i += 2; continue; }  // U+0080..U+02FF: all inert (no marks before U+0300)
    if (!t) t = &inert_table();
    if (!t->inert(utf8::next_cp(text, i))) return false;
  }
  return true;
}

std::string nfc_normalize(std::string_view text) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &dst,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("tokenizer: NFC normalisation failed: {}", utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

bool nfc_normalize_if_needed(std::string_view text, std::string& out) {
  if (nfc_quick_check(text)) return false;
  out = nfc_normalize(text);
  return true;
}

}  // namespace bonsai
