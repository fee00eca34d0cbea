#include "tokenizer/bpe_trainer.h"

#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>

#include "tokenizer/byte_alphabet.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace bonsai {
namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> syms;
  int64_t count;
};

}  // namespace

Vocabulary train_tiny_bpe(const std::string& corpus, int n_merges, const std::vector<std::string>& specials) {
  if (n_merges < 0) fail("train_tiny_bpe: n_merges must be >= 0, got {}", n_merges);
  if (const auto bad = utf8::first_invalid(corpus))
    fail("train_tiny_bpe: corpus is not valid UTF-8 at byte offset {}", *bad);

  Vocabulary v;
  v.pre = "qwen35";
  std::vector<std::string> bytes_of;  // raw bytes per id
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    v.tokens.push_back(bytes_to_alphabet(one));
    v.token_types.push_back(static_cast<int32_t>(TokenType::Normal));
    bytes_of.push_back(one);
    id_of.emplace(one, b);
  }

  // Distinct pieces with their counts; std::map gives a fixed order independent of hashing.
  const std::string norm = nfc_normalize(corpus);
  std::map<std::string, int64_t> piece_count;
  {
    const PreTokenizer pre("qwen35");
    std::vector<std::string_view> pieces;
    pre.split(norm, pieces);
    for (auto p : pieces) ++piece_count[std::string(p)];
  }
  std::vector<Word> words;
  words.reserve(piece_count.size());
  for (const auto& [p, c] : piece_count) {
    Word w{{}, c};
    for (char ch : p) w.syms.push_back(static_cast<uint8_t>(ch));
    words.push_back(std::move(w));
  }

  std::unordered_map<uint64_t, int64_t> count;               // pair -> weighted occurrences
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;  // pair -> words that had it (may be stale)
  for (uint32_t wi = 0; wi < words.size(); ++wi) {
    const auto& s = words[wi].syms;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      count[k] += words[wi].count;
      auto& wl = where[k];
      if (wl.empty() || wl.back() != wi) wl.push_back(wi);
    }
  }
  // Max-heap on (count, then smaller key); entries are checked against `count` when popped.
  using Entry = std::pair<int64_t, uint64_t>;
  auto worse = [](const Entry& x, const Entry& y) {
    if (x.first != y.first) return x.first < y.first;
    return x.second > y.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  for (const auto& [k, c] : count) heap.emplace(c, k);

  std::vector<uint32_t> stamp(words.size(), 0);
  uint32_t step = 0;
  while (static_cast<int>(v.merges.size()) < n_merges && !heap.empty()) {
    const auto [c, k] = heap.top();
    heap.pop();
    const auto it = count.find(k);
    if (it == count.end() || it->second != c) continue;  // stale
    if (c < 2) break;                                     // nothing left worth merging
    const auto a = static_cast<int32_t>(k >> 32), b = static_cast<int32_t>(k & 0xFFFFFFFFu);
    const std::string merged = bytes_of[static_cast<size_t>(a)] + bytes_of[static_cast<size_t>(b)];
    int32_t t;
    if (const auto f = id_of.find(merged); f != id_of.end()) {
      t = f->second;
    } else {
      t = static_cast<int32_t>(v.tokens.size());
      v.tokens.push_back(bytes_to_alphabet(merged));
      v.token_types.push_back(static_cast<int32_t>(TokenType::Normal));
      bytes_of.push_back(merged);
      id_of.emplace(merged, t);
    }
    v.merges.push_back(v.tokens[static_cast<size_t>(a)] + " " + v.tokens[static_cast<size_t>(b)]);

    ++step;
    std::vector<uint64_t> touched;
    const std::vector<uint32_t> ws = std::move(where[k]);
    where.erase(k);
    for (uint32_t wi : ws) {
      if (stamp[wi] == step) continue;
      stamp[wi] = step;
      Word& w = words[wi];
      auto& s = w.syms;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t pk = pair_key(s[i], s[i + 1]);
        count[pk] -= w.count;
        touched.push_back(pk);
      }
      std::vector<int32_t> ns;
      ns.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          ns.push_back(t);
          i += 2;
        } else {
          ns.push_back(s[i]);
          i += 1;
        }
      }
      s = std::move(ns);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t pk = pair_key(s[i], s[i + 1]);
        count[pk] += w.count;
        touched.push_back(pk);
        auto& wl = where[pk];
        if (wl.empty() || wl.back() != wi) wl.push_back(wi);
      }
    }
    count.erase(k);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t pk : touched) {
      const auto ci = count.find(pk);
      if (ci == count.end()) continue;
      if (ci->second <= 0) {
        count.erase(ci);
        continue;
      }
      heap.emplace(ci->second, pk);
    }
  }

  std::map<std::string, bool> known;
  for (const auto& t : qwen35_added_tokens()) known.emplace(t.text, t.special);
  for (const auto& s : specials) {
    if (s.empty()) fail("train_tiny_bpe: empty special token");
    if (utf8::first_invalid(s)) fail("train_tiny_bpe: special token is not valid UTF-8");
    for (size_t i = 256; i < v.tokens.size(); ++i)
      if (v.token_types[i] != static_cast<int32_t>(TokenType::Normal) && v.tokens[i] == s)
        fail("train_tiny_bpe: special token '{}' given twice", s);
    bool control;
    if (const auto f = known.find(s); f != known.end()) control = f->second;
    else control = s.size() >= 4 && s.rfind("<|", 0) == 0 && s.compare(s.size() - 2, 2, "|>") == 0;
    v.tokens.push_back(s);
    v.token_types.push_back(static_cast<int32_t>(control ? TokenType::Control : TokenType::UserDefined));
  }
  auto added_id = [&](std::string_view text) -> std::optional<int32_t> {
    for (size_t i = v.tokens.size(); i-- > 0;)
      if (v.tokens[i] == text && v.is_added(static_cast<int32_t>(i))) return static_cast<int32_t>(i);
    return std::nullopt;
  };
  if (auto id = added_id("<|im_end|>")) v.eos_id = *id;
  else if (auto id2 = added_id("<|endoftext|>")) v.eos_id = *id2;
  v.pad_id = added_id("<|endoftext|>");
  v.validate("train_tiny_bpe");
  return v;
}

Vocabulary tiny_vocabulary(int n_merges) {
  return train_tiny_bpe(std::string(tiny_bpe_corpus()), n_merges, qwen35_added_token_texts());
}

}  // namespace bonsai
