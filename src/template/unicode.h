// Internal Unicode helpers for the template interpreter: UTF-8 <-> code points and the slices of
// Python's str semantics (isspace, case mapping, printability) that chat templates touch.
// Case mapping covers ASCII, Latin-1, Latin Extended-A/Additional, Greek, Cyrillic, Armenian and
// fullwidth Latin; other scripts map to themselves (documented limitation).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace bonsai::tpl::uni {

// Decodes UTF-8; an invalid byte decodes to U+FFFD.
std::u32string decode(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
std::string encode(std::u32string_view s);
// Decodes the code point at pos and advances pos (invalid byte: U+FFFD, one byte).
char32_t next_cp(std::string_view s, size_t& pos);
// Decodes the code point ending at pos and moves pos to its start.
char32_t prev_cp(std::string_view s, size_t& pos);
// Number of code points (Python len(str)).
size_t length(std::string_view s);
bool is_ascii(std::string_view s);

// Python str.isspace() for one code point (also what `\s` matches in Python's re).
bool is_space(char32_t c);
// Python str.splitlines() line boundaries.
bool is_linebreak(char32_t c);
// Python str.isprintable() approximation (for repr()).
bool is_printable(char32_t c);
bool is_digit(char32_t c);    // str.isdigit (ASCII + common decimal digit blocks)
bool is_alpha(char32_t c);    // str.isalpha approximation
bool is_alnum(char32_t c);
bool is_word(char32_t c);     // regex \w approximation

// Full case mapping (may produce more than one code point, e.g. U+00DF -> "SS").
void to_upper(char32_t c, std::u32string& out);
void to_lower(char32_t c, std::u32string& out);
void to_title(char32_t c, std::u32string& out);
char32_t simple_upper(char32_t c);
char32_t simple_lower(char32_t c);
bool is_cased(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);

// Python str methods on whole strings.
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string swapcase(std::string_view s);

}  // namespace bonsai::tpl::uni
