// Internal Unicode helpers for the template interpreter: UTF-8 <-> code points and Python's str
// semantics (isspace/isalpha/..., full case mapping with final sigma, printability), from tables
// generated out of Python's unicodedata (unicode_tables.inc).
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

// Python's str predicates for one code point (tables generated from Python's unicodedata).
bool is_space(char32_t c);      // str.isspace (also what `\s` matches in Python's re)
bool is_linebreak(char32_t c);  // str.splitlines() boundaries
bool is_printable(char32_t c);  // str.isprintable (repr() escapes the rest)
bool is_digit(char32_t c);
bool is_decimal(char32_t c);
bool is_numeric(char32_t c);
bool is_alpha(char32_t c);
bool is_alnum(char32_t c);
bool is_word(char32_t c);  // regex \w
bool is_cased(char32_t c);
bool is_case_ignorable(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_title(char32_t c);  // titlecase letter (Lt)

// Full case mapping (may produce several code points, e.g. U+00DF -> "SS").
void to_upper(char32_t c, std::u32string& out);
void to_lower(char32_t c, std::u32string& out);
void to_title(char32_t c, std::u32string& out);

// Python str methods on whole strings.
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string swapcase(std::string_view s);

}  // namespace bonsai::tpl::uni
