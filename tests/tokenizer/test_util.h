// Shared helpers of the tokenizer tests.
#pragma once
#include <cstdio>
#include <memory>
#include <string>

#include "tokenizer/bpe_trainer.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace bonsai::test {

// Reads a .gz file through the system's gzip (an essential Debian package), so the test binary needs no
// zlib of its own.
inline std::string gunzip_file(const std::string& path) {
  const std::string cmd = "gzip -dc '" + path + "'";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) fail("cannot run {}", cmd);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  if (out.empty()) fail("{}: gzip produced no output", path);
  return out;
}

inline std::string data_path(const std::string& name) { return std::string(BONSAI_TEST_DATA) + "/tokenizer/" + name; }

// The real Qwen3.5 vocabulary (fixture), loaded once per process.
inline const Vocabulary& qwen_vocab() {
  static const Vocabulary v =
      vocabulary_from_tokenizer_json_text(gunzip_file(data_path("qwen35_tokenizer.json.gz")), "qwen35_tokenizer.json.gz");
  return v;
}
inline const Tokenizer& qwen_tokenizer(const std::string& pre) {
  static const Tokenizer t35(qwen_vocab());
  static const Tokenizer t2([] {
    Vocabulary v = qwen_vocab();
    v.pre = "qwen2";
    return v;
  }());
  return pre == "qwen2" ? t2 : t35;
}

inline const Tokenizer& tiny_tokenizer() {
  static const Tokenizer t(tiny_vocabulary(1200));
  return t;
}

}  // namespace bonsai::test
