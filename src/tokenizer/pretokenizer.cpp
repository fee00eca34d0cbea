#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <mutex>

#include "util/error.h"

namespace bonsai {

// The HF spelling (what tokenizer.json files carry, compared verbatim to detect the pre-tokenizer).
static const char* const kQwen35Hf =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
static const char* const kQwen2Hf =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// PCRE2 (UTF + UCP) compiles these HF patterns verbatim and agrees with Oniguruma / HF on them: \s
// includes U+0085 and the Unicode spaces, \p{L}/\p{M}/\p{N} are the general categories, and the caseless
// 's also matches U+017F (long s), as in HF. The fixture corpus covers each of these cases.

const std::vector<PreTokenizerSpec>& known_pretokenizers() {
  static const std::vector<PreTokenizerSpec> v = {{"qwen35", kQwen35Hf}, {"qwen2", kQwen2Hf}};
  return v;
}

std::string known_pretokenizer_names() {
  std::string s;
  for (const auto& p : known_pretokenizers()) {
    if (!s.empty()) s += ", ";
    s += p.name;
  }
  return s;
}

const char* pretokenizer_hf_regex(std::string_view name) {
  for (const auto& p : known_pretokenizers())
    if (name == p.name) return p.hf_regex;
  fail("tokenizer: unknown pre-tokenizer '{}' (known: {})", name, known_pretokenizer_names());
}

std::string pretokenizer_name_for_regex(std::string_view regex) {
  for (const auto& p : known_pretokenizers())
    if (regex == p.hf_regex) return p.name;
  return {};
}

struct PreTokenizer::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  // Match data is per call (pcre2 match data is not shareable between threads); a small pool avoids an
  // allocation per split() call.
  mutable std::mutex pool_mu;
  mutable std::vector<pcre2_match_data*> pool;

  ~Impl() {
    for (auto* md : pool) pcre2_match_data_free(md);
    if (code) pcre2_code_free(code);
  }
  pcre2_match_data* acquire() const {
    {
      std::lock_guard<std::mutex> lk(pool_mu);
      if (!pool.empty()) {
        auto* md = pool.back();
        pool.pop_back();
        return md;
      }
    }
    return pcre2_match_data_create_from_pattern(code, nullptr);
  }
  void release(pcre2_match_data* md) const {
    std::lock_guard<std::mutex> lk(pool_mu);
    pool.push_back(md);
  }
};

PreTokenizer::PreTokenizer(std::string_view name) : name_(name), impl_(std::make_unique<Impl>()) {
  const char* pattern = pretokenizer_hf_regex(name);  // throws for an unknown name, listing the known ones
  int err = 0;
  PCRE2_SIZE erroff = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &erroff, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("tokenizer: pre-tokenizer '{}': PCRE2 compile error at {}: {}", name, erroff,
         reinterpret_cast<const char*>(msg));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

bool PreTokenizer::jit() const { return impl_->jit; }

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  pcre2_match_data* md = impl_->acquire();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  while (pos < n) {
    // The input was validated by the caller: skip PCRE2's UTF check (it would rescan from `pos` each call).
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                              : pcre2_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      out.emplace_back(text.data() + pos, n - pos);
      break;
    }
    if (rc < 0) {
      impl_->release(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("tokenizer: pre-tokenizer '{}': match error at byte {}: {}", name_, pos,
           reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s > pos) out.emplace_back(text.data() + pos, s - pos);  // unmatched gap: its own piece
    if (e > s) {
      out.emplace_back(text.data() + s, e - s);
      pos = e;
    } else {
      // Empty match (the known patterns cannot produce one): step over one code point.
      size_t step = 1;
      while (s + step < n && (static_cast<uint8_t>(text[s + step]) & 0xC0) == 0x80) ++step;
      if (s > pos) {
        pos = s;
      } else {
        out.emplace_back(text.data() + s, step);
        pos = s + step;
      }
    }
  }
  impl_->release(md);
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> v;
  split(text, v);
  return {v.begin(), v.end()};
}

}  // namespace bonsai
