// jinja2's lexer (root/comment/block/variable/raw states) with the transformers settings:
// trim_blocks, lstrip_blocks, no trailing newline kept, newlines normalised to "\n".
#include <cerrno>
#include <cstdlib>

#include "template/ast.h"
#include "template/chat_template.h"
#include "template/unicode.h"

namespace bonsai::tpl {

namespace {

[[noreturn]] void syntax(int line, int col, std::string msg) {
  throw TemplateError(TemplateError::Kind::Syntax, std::move(msg), line, col);
}

// Decodes the code point ending just before `end`; returns its start.
size_t prev_cp(std::string_view s, size_t end, char32_t& cp) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
  std::u32string d = uni::decode(s.substr(start, end - start));
  cp = d.empty() ? 0xFFFD : d.back();
  if (d.size() != 1) {  // malformed: treat the last byte alone
    start = end - 1;
    cp = static_cast<unsigned char>(s[start]);
  }
  return start;
}

// Length of s after Python's str.rstrip().
size_t rstrip_len(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    char32_t cp;
    size_t st = prev_cp(s, end, cp);
    if (!uni::is_space(cp)) break;
    end = st;
  }
  return end;
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (char32_t c : uni::decode(s))
    if (!uni::is_space(c)) return false;
  return true;
}

// Skips Python-whitespace code points starting at pos.
size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) {
      if (!uni::is_space(c)) break;
      ++pos;
      continue;
    }
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    std::u32string d = uni::decode(s.substr(pos, len));
    if (d.size() != 1 || !uni::is_space(d[0])) break;
    pos += len;
  }
  return pos;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

// `(\d+_)*\d+` at pos; returns end or pos if no match.
size_t match_digits(std::string_view s, size_t pos) {
  size_t p = pos;
  if (p >= s.size() || !is_digit(s[p])) return pos;
  while (true) {
    while (p < s.size() && is_digit(s[p])) ++p;
    if (p + 1 < s.size() && s[p] == '_' && is_digit(s[p + 1])) {
      ++p;
      continue;
    }
    return p;
  }
}

size_t match_float(std::string_view s, size_t pos) {
  if (pos > 0 && s[pos - 1] == '.') return pos;
  size_t p = match_digits(s, pos);
  if (p == pos) return pos;
  // alternative 1: optional fraction, required exponent
  {
    size_t q = p;
    if (q < s.size() && s[q] == '.') {
      size_t r = match_digits(s, q + 1);
      if (r != q + 1) q = r;
    }
    if (q < s.size() && (s[q] == 'e' || s[q] == 'E')) {
      size_t r = q + 1;
      if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
      size_t t = match_digits(s, r);
      if (t != r) return t;
    }
  }
  // alternative 2: required fraction
  if (p < s.size() && s[p] == '.') {
    size_t r = match_digits(s, p + 1);
    if (r != p + 1) return r;
  }
  return pos;
}

size_t match_integer(std::string_view s, size_t pos, int& base) {
  size_t n = s.size();
  if (pos >= n || !is_digit(s[pos])) return pos;
  if (s[pos] == '0' && pos + 1 < n) {
    char k = static_cast<char>(s[pos + 1] | 0x20);
    auto ok = [&](char c) {
      c = static_cast<char>(c | 0x20);
      if (k == 'b') return c == '0' || c == '1';
      if (k == 'o') return c >= '0' && c <= '7';
      return is_digit(c) || (c >= 'a' && c <= 'f');
    };
    if (k == 'b' || k == 'o' || k == 'x') {
      size_t p = pos + 2;
      size_t last = pos;
      while (p < n) {
        if (s[p] == '_' && p + 1 < n && ok(s[p + 1])) {
          p += 2;
        } else if (s[p] != '_' && ok(s[p])) {
          ++p;
        } else {
          break;
        }
        last = p;
      }
      if (last != pos) {
        base = k == 'b' ? 2 : k == 'o' ? 8 : 16;
        return last;
      }
    }
  }
  base = 10;
  if (s[pos] == '0') {
    size_t p = pos + 1;
    while (p < n) {
      if (s[p] == '0') {
        ++p;
      } else if (s[p] == '_' && p + 1 < n && s[p + 1] == '0') {
        p += 2;
      } else {
        break;
      }
    }
    return p;
  }
  size_t p = pos + 1;
  while (p < n) {
    if (is_digit(s[p])) {
      ++p;
    } else if (s[p] == '_' && p + 1 < n && is_digit(s[p + 1])) {
      p += 2;
    } else {
      break;
    }
  }
  return p;
}

int hexval(char32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
  return -1;
}

// Python's `.encode("ascii", "backslashreplace").decode("unicode-escape")` on a literal body.
std::string unescape(std::string_view raw, int line, int col) {
  std::u32string in = uni::decode(raw);
  std::string out;
  char buf[16];
  for (size_t k = 0; k < in.size(); ++k) {
    char32_t c = in[k];
    if (c != '\\') {
      uni::append_utf8(out, c);
      continue;
    }
    if (k + 1 >= in.size()) syntax(line, col, "\\ at end of string");
    char32_t d = in[++k];
    switch (d) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
      case 'u':
      case 'U': {
        int digits = d == 'x' ? 2 : d == 'u' ? 4 : 8;
        char32_t v = 0;
        for (int j = 0; j < digits; ++j) {
          if (k + 1 >= in.size() || hexval(in[k + 1]) < 0)
            syntax(line, col,
                   d == 'x' ? "truncated \\xXX escape" : d == 'u' ? "truncated \\uXXXX escape"
                                                                  : "truncated \\UXXXXXXXX escape");
          v = v * 16 + static_cast<char32_t>(hexval(in[++k]));
        }
        if (v > 0x10FFFF) syntax(line, col, "illegal Unicode character");
        uni::append_utf8(out, v);
        break;
      }
      case 'N': syntax(line, col, "\\N{...} escapes in string literals are not supported");
      default:
        if (d >= '0' && d <= '7') {
          char32_t v = d - '0';
          for (int j = 0; j < 2 && k + 1 < in.size() && in[k + 1] >= '0' && in[k + 1] <= '7'; ++j)
            v = v * 8 + (in[++k] - '0');
          uni::append_utf8(out, v);
        } else if (d >= 0x80) {
          // backslashreplace turned d into \xNN / \uNNNN / \UNNNNNNNN; the "\\" pair decodes to "\".
          out += '\\';
          if (d < 0x100)
            std::snprintf(buf, sizeof(buf), "x%02x", static_cast<unsigned>(d));
          else if (d < 0x10000)
            std::snprintf(buf, sizeof(buf), "u%04x", static_cast<unsigned>(d));
          else
            std::snprintf(buf, sizeof(buf), "U%08x", static_cast<unsigned>(d));
          out += buf;
        } else {
          out += '\\';
          uni::append_utf8(out, d);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      char c = source[k];
      if (c == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += c;
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    std::string_view s = src_;
    const size_t n = s.size();
    bool line_starting = true;
    while (pos_ < n) {
      size_t p = pos_;
      while (true) {
        p = s.find('{', p);
        if (p == std::string_view::npos || p + 1 >= n) {
          p = std::string_view::npos;
          break;
        }
        char k = s[p + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++p;
      }
      if (p == std::string_view::npos) {
        emit_data(s.substr(pos_));
        advance_to(n);
        break;
      }
      char kind = s[p + 1];
      char sign = (p + 2 < n && (s[p + 2] == '-' || s[p + 2] == '+')) ? s[p + 2] : 0;
      size_t raw_end = 0;
      bool raw = kind == '%' && match_raw_begin(s, p, raw_end);
      std::string_view text = strip_text(s.substr(pos_, p - pos_), sign, kind != '{', line_starting);
      emit_data(text);
      advance_to(p);
      if (raw) {
        int tag_line = line_, tag_col = col_of(p);
        advance_to(raw_end);
        line_starting = raw_end > 0 && s[raw_end - 1] == '\n';
        line_starting = lex_raw_body(s, tag_line, tag_col, line_starting);
        continue;
      }
      size_t after_open = p + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t q = s.find("#}", after_open);
        if (q == std::string_view::npos) syntax(line_, col_of(p), "Missing end of comment tag");
        size_t after = q + 2;
        if (q > after_open && s[q - 1] == '-') {
          after = skip_space(s, after);
        } else if (q > after_open && s[q - 1] == '+') {
          // keep whitespace
        } else if (after < n && s[after] == '\n') {
          ++after;  // trim_blocks
        }
        line_starting = after > q + 2 && s[after - 1] == '\n';
        advance_to(after);
        continue;
      }
      // block or variable tag
      Token open;
      open.type = kind == '%' ? Tok::BlockBegin : Tok::VarBegin;
      open.line = line_;
      open.col = col_of(p);
      tokens_.push_back(open);
      advance_to(after_open);
      line_starting = lex_tag(s, kind == '%', open.line, open.col);
    }
    Token eof;
    eof.type = Tok::Eof;
    eof.line = line_;
    eof.col = col_of(pos_);
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
  std::vector<Token> tokens_;

  int col_of(size_t p) const { return static_cast<int>(p - line_start_) + 1; }

  void advance_to(size_t p) {
    for (size_t k = pos_; k < p; ++k) {
      if (src_[k] == '\n') {
        ++line_;
        line_start_ = k + 1;
      }
    }
    pos_ = p;
  }

  void emit_data(std::string_view text) {
    if (text.empty()) return;
    Token t;
    t.type = Tok::Data;
    t.text = std::string(text);
    t.line = line_;
    t.col = col_of(pos_);
    tokens_.push_back(std::move(t));
  }

  // jinja2's OptionalLStrip handling of the text before a tag.
  std::string_view strip_text(std::string_view text, char sign, bool lstrip_kind, bool line_starting) {
    if (sign == '-') return text.substr(0, rstrip_len(text));
    if (sign != '+' && lstrip_kind) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && all_space(text.substr(l_pos))) return text.substr(0, l_pos);
    }
    return text;
  }

  // `{%(-|+|)\s*raw\s*(?:-%}\s*|%})` at p.
  static bool match_raw_begin(std::string_view s, size_t p, size_t& end) {
    size_t q = p + 2;
    if (q < s.size() && (s[q] == '-' || s[q] == '+')) ++q;
    q = skip_space(s, q);
    if (s.substr(q, 3) != "raw") return false;
    q = skip_space(s, q + 3);
    if (s.substr(q, 3) == "-%}") {
      end = skip_space(s, q + 3);
      return true;
    }
    if (s.substr(q, 2) == "%}") {
      end = q + 2;
      return true;
    }
    return false;
  }

  bool lex_raw_body(std::string_view s, int tag_line, int tag_col, bool line_starting) {
    size_t q = pos_;
    while (true) {
      q = s.find("{%", q);
      if (q == std::string_view::npos) syntax(tag_line, tag_col, "Missing end of raw directive");
      size_t r = q + 2;
      char sign = 0;
      if (r < s.size() && (s[r] == '-' || s[r] == '+')) sign = s[r++];
      r = skip_space(s, r);
      if (s.substr(r, 6) == "endraw") {
        r = skip_space(s, r + 6);
        size_t end = 0;
        if (s.substr(r, 3) == "+%}") {
          end = r + 3;
        } else if (s.substr(r, 3) == "-%}") {
          end = skip_space(s, r + 3);
        } else if (s.substr(r, 2) == "%}") {
          end = r + 2;
          if (end < s.size() && s[end] == '\n') ++end;
        }
        if (end) {
          std::string_view text = strip_text(s.substr(pos_, q - pos_), sign, true, line_starting);
          emit_data(text);
          advance_to(end);
          return s[end - 1] == '\n';
        }
      }
      q += 2;
    }
  }

  // Tokens inside {% %} / {{ }}; returns jinja2's line_starting after the closing tag.
  bool lex_tag(std::string_view s, bool block, int open_line, int open_col) {
    const size_t n = s.size();
    std::vector<char> balance;
    while (true) {
      if (pos_ >= n)
        syntax(open_line, open_col,
               std::string("unexpected end of template: unterminated '") + (block ? "{%" : "{{") + "' tag");
      if (balance.empty()) {
        size_t end = 0;
        if (block) {
          if (s.substr(pos_, 3) == "+%}") {
            end = pos_ + 3;
          } else if (s.substr(pos_, 3) == "-%}") {
            end = skip_space(s, pos_ + 3);
          } else if (s.substr(pos_, 2) == "%}") {
            end = pos_ + 2;
            if (end < n && s[end] == '\n') ++end;
          }
        } else {
          if (s.substr(pos_, 3) == "-}}") {
            end = skip_space(s, pos_ + 3);
          } else if (s.substr(pos_, 2) == "}}") {
            end = pos_ + 2;
          }
        }
        if (end) {
          Token t;
          t.type = block ? Tok::BlockEnd : Tok::VarEnd;
          t.line = line_;
          t.col = col_of(pos_);
          tokens_.push_back(t);
          advance_to(end);
          return s[end - 1] == '\n';
        }
      }
      size_t sp = skip_space(s, pos_);
      if (sp != pos_) {
        advance_to(sp);
        continue;
      }
      Token t;
      t.line = line_;
      t.col = col_of(pos_);
      char c = s[pos_];
      size_t e = match_float(s, pos_);
      if (e != pos_) {
        std::string lit;
        for (size_t k = pos_; k < e; ++k)
          if (s[k] != '_') lit += s[k];
        t.type = Tok::Float;
        t.num = Value::number(std::strtod(lit.c_str(), nullptr));
        t.text = std::string(s.substr(pos_, e - pos_));
        tokens_.push_back(std::move(t));
        advance_to(e);
        continue;
      }
      int base = 10;
      e = match_integer(s, pos_, base);
      if (e != pos_) {
        std::string lit;
        size_t start = pos_ + (base == 10 ? 0 : 2);
        for (size_t k = start; k < e; ++k)
          if (s[k] != '_') lit += s[k];
        errno = 0;
        long long v = std::strtoll(lit.c_str(), nullptr, base);
        if (errno == ERANGE) syntax(t.line, t.col, "integer literal too large: " + std::string(s.substr(pos_, e - pos_)));
        t.type = Tok::Integer;
        t.num = Value::integer(v);
        t.text = std::string(s.substr(pos_, e - pos_));
        tokens_.push_back(std::move(t));
        advance_to(e);
        continue;
      }
      if (is_name_char(c)) {
        size_t q = pos_;
        while (q < n && is_name_char(s[q])) ++q;
        t.type = Tok::Name;
        t.text = std::string(s.substr(pos_, q - pos_));
        tokens_.push_back(std::move(t));
        advance_to(q);
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t q = pos_ + 1;
        bool closed = false;
        while (q < n) {
          if (s[q] == '\\') {
            q += 2;
            continue;
          }
          if (s[q] == c) {
            closed = true;
            break;
          }
          ++q;
        }
        if (closed) {
          t.type = Tok::String;
          t.text = unescape(s.substr(pos_ + 1, q - pos_ - 1), t.line, t.col);
          tokens_.push_back(std::move(t));
          advance_to(q + 1);
          continue;
        }
        syntax(t.line, t.col, std::string("unexpected char ") + c + " (unterminated string literal)");
      }
      static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                  "(",  ")",  "{",  "}",  ">",  "<",  "=", ".", ":", "|", ",", ";"};
      const char* op = nullptr;
      for (const char* o : ops) {
        size_t len = std::char_traits<char>::length(o);
        if (s.substr(pos_, len) == o) {
          op = o;
          break;
        }
      }
      if (!op) {
        std::string ch;
        char32_t cp;
        size_t q = pos_ + 1;
        while (q < n && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) ++q;
        prev_cp(s, q, cp);
        uni::append_utf8(ch, cp);
        syntax(t.line, t.col, "unexpected char " + repr_str(ch));
      }
      std::string o(op);
      if (o == "{" || o == "(" || o == "[") {
        balance.push_back(o == "{" ? '}' : o == "(" ? ')' : ']');
      } else if (o == "}" || o == ")" || o == "]") {
        if (balance.empty()) syntax(t.line, t.col, "unexpected '" + o + "'");
        char want = balance.back();
        balance.pop_back();
        if (want != o[0]) syntax(t.line, t.col, "unexpected '" + o + "', expected '" + std::string(1, want) + "'");
      }
      t.type = Tok::Op;
      t.text = o;
      tokens_.push_back(std::move(t));
      advance_to(pos_ + o.size());
    }
  }
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace bonsai::tpl
