// Unit tests of the tokenizer pieces on the tiny trained vocabulary (no fixture files needed).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "format/gguf.h"
#include "test_util.h"
#include "tokenizer/byte_alphabet.h"
#include "tokenizer/gguf_vocabulary.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace bonsai {
namespace {

using test::tiny_tokenizer;
using Ids = std::vector<int32_t>;

TEST(ByteAlphabet, RoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string a = bytes_to_alphabet(all);
  EXPECT_EQ(alphabet_to_bytes(a), all);
  EXPECT_EQ(bytes_to_alphabet(" "), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(bytes_to_alphabet("\n"), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(bytes_to_alphabet("A"), "A");
  EXPECT_FALSE(alphabet_to_bytes("\xE4\xB8\xAD").has_value());  // U+4E2D is not in the alphabet
}

TEST(Utf8, SanitizeMatchesPythonReplace) {
  // Expected values: bytes.decode("utf-8", "replace") (maximal subparts -> one U+FFFD each).
  const std::string R(utf8::kReplacement);
  EXPECT_EQ(utf8::sanitize("abc"), "abc");
  EXPECT_EQ(utf8::sanitize("\xFF"), R);
  EXPECT_EQ(utf8::sanitize("\xE2\x82("), R + "(");
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98"), R);
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), R + R + R);  // surrogate: ED alone, then A0, 80
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), R + R);
  EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(utf8::sanitize("\xE4\xBD\xA0\xE5\xA5"), "\xE4\xBD\xA0" + R);
  EXPECT_EQ(utf8::first_invalid("ok\xC3"), 2u);
  EXPECT_FALSE(utf8::first_invalid("\xF0\x9F\x98\x80 fine").has_value());
}

TEST(Normalize, QuickCheckNeverSkipsARealChange) {
  // Exhaustive over single code points of the table's range: "inert" must mean NFC(c) == c.
  for (uint32_t cp = 1; cp < 0x30000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    utf8::append_cp(s, cp);
    if (nfc_quick_check(s)) {
      ASSERT_EQ(nfc_normalize(s), s) << "U+" << std::hex << cp;
    }
  }
  // Random pairs and triples of inert code points stay unchanged too.
  std::mt19937 rng(7);
  std::vector<uint32_t> inert;
  for (uint32_t cp = 0x20; cp < 0x30000; cp += 1) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    utf8::append_cp(s, cp);
    if (nfc_quick_check(s)) inert.push_back(cp);
  }
  for (int i = 0; i < 200000; ++i) {
    std::string s;
    for (int k = 0; k < 3; ++k) utf8::append_cp(s, inert[rng() % inert.size()]);
    ASSERT_EQ(nfc_normalize(s), s);
  }
  EXPECT_FALSE(nfc_quick_check("e\xCC\x81"));       // e + U+0301
  EXPECT_FALSE(nfc_quick_check("\xE1\x84\x80\xE1\x85\xA1"));  // Hangul L + V jamo
  EXPECT_EQ(nfc_normalize("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(nfc_normalize("\xE2\x84\xAB"), "\xC3\x85");  // ANGSTROM SIGN -> A with ring
}

TEST(PreTokenizer, UnknownNameListsKnownOnes) {
  try {
    PreTokenizer p("llama3");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("llama3"), std::string::npos) << m;
    EXPECT_NE(m.find("qwen35"), std::string::npos) << m;
    EXPECT_NE(m.find("qwen2"), std::string::npos) << m;
  }
  Vocabulary v = tiny_tokenizer().vocab();
  v.pre = "gpt4o";
  EXPECT_THROW(Tokenizer{v}, Error);
}

TEST(PreTokenizer, SplitsLikeTheQwenRegex) {
  const PreTokenizer p("qwen35");
  EXPECT_EQ(p.split("Hello world's 123"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", "1", "2", "3"}));
  EXPECT_EQ(p.split("a  \n\n b"), (std::vector<std::string>{"a", "  \n\n", " b"}));
  EXPECT_EQ(p.split("x   y"), (std::vector<std::string>{"x", "  ", " y"}));
  EXPECT_EQ(p.split("IT'LL"), (std::vector<std::string>{"IT", "'LL"}));
  // qwen35 keeps a combining mark with its letters; qwen2 splits it off.
  const std::string deva = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";  // नमस्ते
  EXPECT_EQ(p.split(deva).size(), 1u);
  EXPECT_GT(PreTokenizer("qwen2").split(deva).size(), 1u);
  EXPECT_TRUE(p.split("").empty());
}

TEST(Tokenizer, EmptyString) {
  EXPECT_TRUE(tiny_tokenizer().encode("").empty());
  EXPECT_TRUE(tiny_tokenizer().encode("", true).empty());
  EXPECT_EQ(tiny_tokenizer().decode(Ids{}), "");
}

TEST(Tokenizer, SpecialsParsedOnlyWhenAsked) {
  const Tokenizer& t = tiny_tokenizer();
  const int32_t im_start = t.token_id("<|im_start|>"), im_end = t.token_id("<|im_end|>");
  const int32_t think = t.token_id("<think>");
  ASSERT_GE(im_start, 0);
  ASSERT_GE(im_end, 0);
  ASSERT_GE(think, 0);
  EXPECT_TRUE(t.is_control(im_start));
  EXPECT_FALSE(t.is_control(think));

  const std::string s = "<|im_start|>user\nhi<|im_end|>";
  const Ids on = t.encode(s, true);
  ASSERT_GE(on.size(), 3u);
  EXPECT_EQ(on.front(), im_start);
  EXPECT_EQ(on.back(), im_end);
  const Ids off = t.encode(s, false);
  for (int32_t id : off) EXPECT_FALSE(t.is_control(id));
  EXPECT_EQ(t.decode(off), s);  // the text comes back as plain text
  EXPECT_EQ(t.decode(on), s);
  EXPECT_EQ(t.decode(on, /*skip_special=*/true), "user\nhi");

  // A string of only special tokens.
  EXPECT_EQ(t.encode("<|im_start|><|im_end|><|im_start|>", true), (Ids{im_start, im_end, im_start}));
  // UserDefined tokens (<think>) are matched in both modes, as HF does for special=false added tokens.
  EXPECT_EQ(t.encode("<think>", false), (Ids{think}));
  EXPECT_EQ(t.encode("<think></think>", true), (Ids{think, t.token_id("</think>")}));
  // Near misses are plain text.
  for (int32_t id : t.encode("<|im_start|", true)) EXPECT_FALSE(t.vocab().is_added(id));
}

TEST(Tokenizer, InvalidUtf8Throws) {
  const Tokenizer& t = tiny_tokenizer();
  try {
    t.encode(std::string("abc\xFF" "def"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.encode("\xC3"), Error);           // truncated at the end
  EXPECT_THROW(t.encode("\xED\xA0\x80"), Error);   // surrogate
  EXPECT_NO_THROW(t.encode(utf8::sanitize("abc\xFF" "def")));
}

TEST(Tokenizer, RoundTripsTheTrainingCorpusAndMore) {
  const Tokenizer& t = tiny_tokenizer();
  const std::string corpus(tiny_bpe_corpus());
  const Ids ids = t.encode(corpus, true);
  EXPECT_EQ(t.decode(ids), corpus);
  EXPECT_LT(ids.size(), corpus.size() / 2);  // the merges do compress the training text
  for (const char* s : {"never seen: Zyzzyva quokka 42 ∰ 𝔘 👩‍👩‍👧‍👦", "e\xCC\x81", "\t\t \r\n x"}) {
    EXPECT_EQ(t.decode(t.encode(s)), nfc_normalize(s)) << s;
  }
}

TEST(StreamingDecoder, NeverEmitsHalfACharacter) {
  const Tokenizer& t = tiny_tokenizer();
  // Tokens 0..255 of the tiny vocabulary are the single bytes: feed 👍🏽 (8 bytes) byte by byte.
  const std::string emoji = "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD";
  StreamingDecoder d(t);
  std::string got;
  for (size_t i = 0; i < emoji.size(); ++i) {
    const std::string piece = d.push(static_cast<uint8_t>(emoji[i]));
    EXPECT_FALSE(utf8::first_invalid(piece).has_value());
    if (i == 3) EXPECT_EQ(piece, "\xF0\x9F\x91\x8D");
    else if (i == 7) EXPECT_EQ(piece, "\xF0\x9F\x8F\xBD");
    else EXPECT_EQ(piece, "") << i;
    got += piece;
  }
  got += d.flush();
  EXPECT_EQ(got, emoji);

  // Ill-formed bytes come out as U+FFFD as soon as they are known bad; an unfinished tail at flush too.
  StreamingDecoder e(t);
  EXPECT_EQ(e.push(0xFF), utf8::kReplacement);
  EXPECT_EQ(e.push(0xF0), "");
  EXPECT_EQ(e.push('A'), std::string(utf8::kReplacement) + "A");
  EXPECT_EQ(e.push(0xE4), "");
  EXPECT_EQ(e.pending_bytes(), 1u);
  EXPECT_EQ(e.flush(), utf8::kReplacement);
}

TEST(StreamingDecoder, EqualsSanitizedBatchDecode) {
  const Tokenizer& t = tiny_tokenizer();
  std::mt19937 rng(11);
  const std::string text = "Tokens: 你好 👩‍💻 नमस्ते ÅÉ مرحبا <|im_end|>";
  const Ids real = t.encode(text, true);
  for (int trial = 0; trial < 300; ++trial) {
    Ids ids;
    if (trial == 0) {
      ids = real;
    } else {
      const int n = 1 + static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i)
        ids.push_back(rng() % 3 == 0 ? real[rng() % real.size()] : static_cast<int32_t>(rng() % t.n_vocab()));
    }
    StreamingDecoder d(t);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string p = d.push(id);
      ASSERT_FALSE(utf8::first_invalid(p).has_value());
      streamed += p;
    }
    streamed += d.flush();
    ASSERT_EQ(streamed, utf8::sanitize(t.decode(ids)));
  }
}

TEST(Trainer, DeterministicAndShapedLikeQwen) {
  const Vocabulary a = tiny_vocabulary(1200), b = tiny_vocabulary(1200);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.merges.size(), 1200u);
  const size_t n_added = qwen35_added_tokens().size();
  EXPECT_EQ(a.size(), 256 + 1200 + n_added);  // no merge of this corpus re-creates an existing token
  EXPECT_EQ(a.pre, "qwen35");
  EXPECT_EQ(a.tokens[static_cast<size_t>(a.eos_id)], "<|im_end|>");
  ASSERT_TRUE(a.pad_id);
  EXPECT_EQ(a.tokens[static_cast<size_t>(*a.pad_id)], "<|endoftext|>");
  const auto stops = a.stop_ids();
  EXPECT_EQ(stops.size(), 2u);
  for (size_t i = 0; i < n_added; ++i) {
    const size_t id = a.size() - n_added + i;
    EXPECT_EQ(a.tokens[id], qwen35_added_tokens()[i].text);
    EXPECT_EQ(a.token_types[id], static_cast<int32_t>(qwen35_added_tokens()[i].special ? TokenType::Control
                                                                                       : TokenType::UserDefined));
  }
  // Fewer merges is a prefix of more merges.
  const Vocabulary small = tiny_vocabulary(100);
  EXPECT_TRUE(std::equal(small.merges.begin(), small.merges.end(), a.merges.begin()));
  EXPECT_THROW(train_tiny_bpe("x", -1, {}), Error);
  EXPECT_THROW(train_tiny_bpe("bad \xFF", 10, {}), Error);
}

TEST(Vocabulary, BadMergeIsAClearError) {
  Vocabulary v = tiny_vocabulary(10);
  v.merges.push_back("nope zilch");
  try {
    Tokenizer t(v);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merge 10"), std::string::npos) << e.what();
  }
  v = tiny_vocabulary(10);
  v.token_types.pop_back();
  EXPECT_THROW(Tokenizer{v}, Error);
}

TEST(Vocabulary, PaddingRowsAreInert) {
  Vocabulary v = tiny_vocabulary(50);
  const size_t n = v.size();
  pad_vocabulary(v, n + 7);
  ASSERT_EQ(v.size(), n + 7);
  const Tokenizer t(v);
  EXPECT_EQ(t.decode(Ids{static_cast<int32_t>(n + 3)}), "");
  EXPECT_EQ(t.encode("[PAD1460]"), Tokenizer(tiny_vocabulary(50)).encode("[PAD1460]"));
  EXPECT_THROW(t.decode(Ids{static_cast<int32_t>(n + 7)}), Error);
}

TEST(HfJson, TinyVocabularyRoundTrips) {
  const Vocabulary v = tiny_vocabulary(300);
  const std::string dir = ::testing::TempDir();
  write_tokenizer_json(v, dir + "/tokenizer.json");
  write_tokenizer_config_json(v, dir + "/tokenizer_config.json");
  const Vocabulary w = vocabulary_from_hf_dir(dir);
  EXPECT_EQ(w.tokens, v.tokens);
  EXPECT_EQ(w.token_types, v.token_types);
  EXPECT_EQ(w.merges, v.merges);
  EXPECT_EQ(w.eos_id, v.eos_id);
  EXPECT_EQ(w.pad_id, v.pad_id);
  EXPECT_EQ(w.bos_id, v.bos_id);
  const std::string s = "<|im_start|>user\nSome text, 123 and ünïcödé.<|im_end|>";
  EXPECT_EQ(Tokenizer(w).encode(s, true), Tokenizer(v).encode(s, true));
}

TEST(HfJson, UnknownRegexIsRefused) {
  nlohmann::json j = tokenizer_json(tiny_vocabulary(20));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+|\\w+";
  try {
    vocabulary_from_tokenizer_json(j, "x/tokenizer.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("x/tokenizer.json"), std::string::npos) << m;
    EXPECT_NE(m.find("qwen35, qwen2"), std::string::npos) << m;
  }
  j = tokenizer_json(tiny_vocabulary(20));
  j["model"]["type"] = "Unigram";
  EXPECT_THROW(vocabulary_from_tokenizer_json(j, "x"), Error);
}

TEST(Gguf, VocabularyRoundTripsThroughAFile) {
  const Vocabulary v = tiny_vocabulary(200);
  const std::string path = ::testing::TempDir() + "/bonsai_tok_vocab.gguf";
  {
    GgufWriter w;
    w.set("general.architecture", GgufValue::str("qwen35"));
    add_vocabulary_to_gguf(w, v);
    w.write(path);
  }
  const GgufFile f(path);
  const Vocabulary g = vocabulary_from_gguf(f);
  EXPECT_EQ(g.tokens, v.tokens);
  EXPECT_EQ(g.token_types, v.token_types);
  EXPECT_EQ(g.merges, v.merges);
  EXPECT_EQ(g.pre, "qwen35");
  EXPECT_EQ(g.eos_id, v.eos_id);
  EXPECT_EQ(g.pad_id, v.pad_id);
  EXPECT_FALSE(g.bos_id.has_value());
  std::remove(path.c_str());

  // Wrong model / missing keys name the file and the key.
  GgufWriter w2;
  add_vocabulary_to_gguf(w2, v);
  w2.set("tokenizer.ggml.model", GgufValue::str("llama"));
  w2.write(path);
  try {
    vocabulary_from_gguf(GgufFile(path));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tokenizer.ggml.model"), std::string::npos) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
  }
  GgufWriter w3;
  add_vocabulary_to_gguf(w3, v);
  w3.set("tokenizer.ggml.pre", GgufValue::str("falcon"));
  w3.write(path);
  EXPECT_THROW(vocabulary_from_gguf(GgufFile(path)), Error);
  std::remove(path.c_str());
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer& t = tiny_tokenizer();
  const std::string corpus(tiny_bpe_corpus());
  const Ids want = t.encode(corpus, true);
  std::vector<std::thread> th;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      int good = 1;
      for (int r = 0; r < 5; ++r) good &= t.encode(corpus, true) == want;
      ok[static_cast<size_t>(k)] = good;
    });
  for (auto& x : th) x.join();
  for (int v : ok) EXPECT_EQ(v, 1);
}

}  // namespace
}  // namespace bonsai
