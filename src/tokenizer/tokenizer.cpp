#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "tokenizer/byte_alphabet.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace bonsai {
namespace {

constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();

// Open-addressing (linear probing) map from a token pair (left id << 32 | right id) to its merge rank and
// the merged token id. Why not std::unordered_map: this lookup is the BPE inner loop; a flat table with
// a multiplicative hash is ~3x faster and a quarter of the memory for Qwen's 500k merges.
class PairMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
    shift_ = 64 - static_cast<int>(__builtin_ctzll(cap));
  }
  // Keeps the first (lowest-rank) entry for a pair given twice, as HF does.
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    const uint64_t key = make_key(a, b);
    for (size_t i = index(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, rank, merged};
        return;
      }
      if (slots_[i].key == key) return;
    }
  }
  // Rank and merged id of (a, b), or kNoMerge.
  uint32_t find(int32_t a, int32_t b, int32_t* merged) const {
    const uint64_t key = make_key(a, b);
    for (size_t i = index(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *merged = s.merged;
        return s.rank;
      }
      if (s.key == kEmpty) return kNoMerge;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key;
    uint32_t rank;
    int32_t merged;
  };
  static uint64_t make_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t index(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 60;
};

// Open-addressing map from a byte string to a token id, the strings owned elsewhere (the vocabulary):
// no allocation per entry, which keeps building the 248k-token tables of a real vocabulary fast.
class StrIdMap {
 public:
  using KeyOf = std::string_view (*)(const void* ctx, int32_t id);
  void init(size_t n, const void* ctx, KeyOf key_of) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
    ctx_ = ctx;
    key_of_ = key_of;
  }
  // Keeps the first id given for a string.
  void insert(std::string_view key, int32_t id) {
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id < 0) {
        slots_[i] = Slot{h, id};
        return;
      }
      if (slots_[i].hash == h && key_of_(ctx_, slots_[i].id) == key) return;
    }
  }
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && key_of_(ctx_, s.id) == key) return s.id;
    }
  }
  // FNV-1a over 8-byte words, then a final avalanche.
  static uint64_t hash(std::string_view k) {
    uint64_t h = 0xcbf29ce484222325ull ^ k.size();
    size_t i = 0;
    for (; i + 8 <= k.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, k.data() + i, 8);
      h = (h ^ w) * 0x100000001b3ull;
      h ^= h >> 29;
    }
    uint64_t w = 0;
    if (k.size() > i) std::memcpy(&w, k.data() + i, k.size() - i);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
  }

 private:
  struct Slot {
    uint64_t hash;
    int32_t id;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  const void* ctx_ = nullptr;
  KeyOf key_of_ = nullptr;
};

struct AddedToken {
  std::string text;
  int32_t id;
  bool control;
};

// Per-encode scratch (one per call; nothing shared between threads).
struct Workspace {
  std::vector<int32_t> ids, nxt, prv, merged;  // [n symbols] linked list over the piece's symbols
  std::vector<uint32_t> rank;                  // [n] rank of the pair (i, nxt[i]), kNoMerge if none
  std::vector<std::pair<uint32_t, int32_t>> heap;  // (rank, position) min-heap for long pieces
  std::vector<std::string_view> pieces;
  std::string normalized;
};

}  // namespace

struct Tokenizer::Impl {
  PreTokenizer pre;
  PairMap pairs;
  std::array<int32_t, 256> byte_id{};              // token id of each single byte, -1 if missing
  std::vector<std::string> raw;                    // [n_vocab] raw bytes per id
  StrIdMap by_bytes;                               // Normal tokens by raw bytes
  std::vector<AddedToken> added;                   // sorted by first byte, then longest first
  std::array<uint16_t, 257> added_start{};         // added[added_start[b] .. added_start[b+1]) start with b
  bool ignore_merges = false;

  // Cache of pieces already merged (words repeat a lot in real text). Guarded by cache_mu; an encode()
  // takes it with try_lock for its whole duration, and simply does without the cache when another
  // thread holds it, so concurrent callers never wait on each other.
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache;  // piece -> (offset, count)
  mutable std::vector<int32_t> cache_ids;

  explicit Impl(const std::string& pre_name) : pre(pre_name) {}

  void bpe(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const;
  void bpe_small(Workspace& ws, size_t n) const;
  void bpe_heap(Workspace& ws, size_t n) const;
  void encode_text(std::string_view text, Workspace& ws, std::vector<int32_t>& out, bool use_cache) const;

  uint32_t pair_rank(int32_t a, int32_t b, int32_t* merged) const {
    if (a < 0 || b < 0) return kNoMerge;
    return pairs.find(a, b, merged);
  }
};

// ------------------------------------------------------------------------------------------------
// Construction

Tokenizer::Tokenizer(Vocabulary vocab) : vocab_(std::move(vocab)) {
  vocab_.validate("tokenizer");
  impl_ = std::make_unique<Impl>(vocab_.pre);
  Impl& m = *impl_;
  m.ignore_merges = vocab_.ignore_merges;
  const size_t n = vocab_.tokens.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("tokenizer: vocabulary of {} tokens is too large", n);

  // Token strings -> raw bytes, and the lookup of Normal tokens by their byte-alphabet spelling (which is
  // how merges name them).
  m.raw.resize(n);
  m.byte_id.fill(-1);
  std::vector<uint8_t> is_bpe(n, 0);  // Normal token spelled in the byte alphabet
  StrIdMap by_alpha;  // by byte-alphabet spelling (how merges name tokens); build-time only
  by_alpha.init(n, &vocab_.tokens, [](const void* c, int32_t id) -> std::string_view {
    return (*static_cast<const std::vector<std::string>*>(c))[static_cast<size_t>(id)];
  });
  m.by_bytes.init(n, &m.raw, [](const void* c, int32_t id) -> std::string_view {
    return (*static_cast<const std::vector<std::string>*>(c))[static_cast<size_t>(id)];
  });
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& t = vocab_.tokens[i];
    const auto type = static_cast<TokenType>(vocab_.token_types[i]);
    switch (type) {
      case TokenType::Control:
      case TokenType::UserDefined:
        m.raw[i] = t;
        if (t.empty()) fail("tokenizer: added token {} has empty text", i);
        if (utf8::first_invalid(t)) fail("tokenizer: added token {} is not valid UTF-8", i);
        m.added.push_back({t, id, type == TokenType::Control});
        break;
      case TokenType::Unused:
        break;  // decodes to nothing, never produced
      default: {
        // Normal (and Undefined/Unknown/Byte, treated alike): byte-alphabet spelling. A string outside the
        // alphabet cannot be produced by byte-level BPE; it still decodes, as its own UTF-8 text.
        auto bytes = alphabet_to_bytes(t);
        m.raw[i] = bytes ? std::move(*bytes) : t;
        if (bytes) {
          is_bpe[i] = 1;
          by_alpha.insert(t, id);  // first id wins for duplicates
          if (m.raw[i].size() == 1 && m.byte_id[static_cast<uint8_t>(m.raw[i][0])] < 0)
            m.byte_id[static_cast<uint8_t>(m.raw[i][0])] = id;
        }
      }
    }
  }

  // raw[] is final now: index the BPE tokens by their bytes (raw[] strings do not move any more).
  for (size_t i = 0; i < n; ++i)
    if (is_bpe[i]) m.by_bytes.insert(m.raw[i], static_cast<int32_t>(i));

  m.pairs.reserve(vocab_.merges.size());
  std::string ab;
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const std::string& mg = vocab_.merges[r];
    const size_t sp = mg.find(' ');
    const std::string_view a(mg.data(), sp), b(mg.data() + sp + 1, mg.size() - sp - 1);
    const int32_t ia = by_alpha.find(a), ib = by_alpha.find(b);
    if (ia < 0 || ib < 0)
      fail("tokenizer: merge {} ('{}') names a token that is not in the vocabulary ('{}')", r, mg, ia < 0 ? a : b);
    ab.assign(a).append(b);
    const int32_t iab = by_alpha.find(ab);
    if (iab < 0) fail("tokenizer: merge {} ('{}') produces '{}', which is not in the vocabulary", r, mg, ab);
    m.pairs.insert(ia, ib, static_cast<uint32_t>(r), iab);
  }

  // Added tokens grouped by first byte, longest first inside a group (leftmost-longest matching).
  std::stable_sort(m.added.begin(), m.added.end(), [](const AddedToken& x, const AddedToken& y) {
    const auto fx = static_cast<uint8_t>(x.text[0]), fy = static_cast<uint8_t>(y.text[0]);
    if (fx != fy) return fx < fy;
    return x.text.size() > y.text.size();
  });
  if (m.added.size() > 65535) fail("tokenizer: {} added tokens is more than supported (65535)", m.added.size());
  size_t k = 0;
  for (int b = 0; b <= 256; ++b) {
    while (k < m.added.size() && static_cast<uint8_t>(m.added[k].text[0]) < b) ++k;
    m.added_start[static_cast<size_t>(b)] = static_cast<uint16_t>(k);
  }
}

Tokenizer::~Tokenizer() = default;

// ------------------------------------------------------------------------------------------------
// BPE

// O(n^2) but allocation-free and branch-light: the right choice for the short pieces real text is made of.
void Tokenizer::Impl::bpe_small(Workspace& ws, size_t n) const {
  int32_t* ids = ws.ids.data();
  int32_t* nxt = ws.nxt.data();
  int32_t* prv = ws.prv.data();
  int32_t* mer = ws.merged.data();
  uint32_t* rk = ws.rank.data();
  for (;;) {
    uint32_t best = kNoMerge;
    int32_t bi = -1;
    for (int32_t i = 0; i >= 0; i = nxt[i])
      if (rk[i] < best) {  // strict: the leftmost of equal ranks wins
        best = rk[i];
        bi = i;
      }
    if (bi < 0) break;
    const int32_t j = nxt[bi];
    ids[bi] = mer[bi];
    nxt[bi] = nxt[j];
    if (nxt[j] >= 0) prv[nxt[j]] = bi;
    rk[bi] = nxt[bi] >= 0 ? pair_rank(ids[bi], ids[nxt[bi]], &mer[bi]) : kNoMerge;
    if (prv[bi] >= 0) rk[prv[bi]] = pair_rank(ids[prv[bi]], ids[bi], &mer[prv[bi]]);
  }
  (void)n;
}

// O(n log n) with a lazy-deletion heap of (rank, position): a heap entry is live iff its position is
// still a live symbol whose current right pair has that rank (ranks are unique per pair, so an equal rank
// means the same pair).
void Tokenizer::Impl::bpe_heap(Workspace& ws, size_t n) const {
  int32_t* ids = ws.ids.data();
  int32_t* nxt = ws.nxt.data();
  int32_t* prv = ws.prv.data();
  int32_t* mer = ws.merged.data();
  uint32_t* rk = ws.rank.data();
  std::vector<uint8_t> dead(n, 0);
  auto& h = ws.heap;
  h.clear();
  auto cmp = [](const std::pair<uint32_t, int32_t>& x, const std::pair<uint32_t, int32_t>& y) {
    return x > y;  // min-heap on (rank, position)
  };
  for (size_t i = 0; i < n; ++i)
    if (rk[i] != kNoMerge) h.emplace_back(rk[i], static_cast<int32_t>(i));
  std::make_heap(h.begin(), h.end(), cmp);
  while (!h.empty()) {
    std::pop_heap(h.begin(), h.end(), cmp);
    const auto [r, bi] = h.back();
    h.pop_back();
    if (dead[static_cast<size_t>(bi)] || rk[bi] != r) continue;
    const int32_t j = nxt[bi];
    dead[static_cast<size_t>(j)] = 1;
    ids[bi] = mer[bi];
    nxt[bi] = nxt[j];
    if (nxt[j] >= 0) prv[nxt[j]] = bi;
    rk[bi] = nxt[bi] >= 0 ? pair_rank(ids[bi], ids[nxt[bi]], &mer[bi]) : kNoMerge;
    if (rk[bi] != kNoMerge) {
      h.emplace_back(rk[bi], bi);
      std::push_heap(h.begin(), h.end(), cmp);
    }
    if (prv[bi] >= 0) {
      const int32_t p = prv[bi];
      rk[p] = pair_rank(ids[p], ids[bi], &mer[p]);
      if (rk[p] != kNoMerge) {
        h.emplace_back(rk[p], p);
        std::push_heap(h.begin(), h.end(), cmp);
      }
    }
  }
}

void Tokenizer::Impl::bpe(std::string_view piece, Workspace& ws, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n == 1) {
    const int32_t id = byte_id[static_cast<uint8_t>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (ignore_merges) {
    const int32_t id = by_bytes.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  // Symbols start as single bytes. A byte with no token is dropped (HF BPE without unk / byte fallback).
  ws.ids.resize(n);
  ws.nxt.resize(n);
  ws.prv.resize(n);
  ws.merged.resize(n);
  ws.rank.resize(n);
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = byte_id[static_cast<uint8_t>(piece[i])];
    if (id >= 0) ws.ids[m++] = id;
  }
  if (m == 0) return;
  for (size_t i = 0; i < m; ++i) {
    ws.nxt[i] = i + 1 < m ? static_cast<int32_t>(i + 1) : -1;
    ws.prv[i] = static_cast<int32_t>(i) - 1;
    ws.rank[i] = i + 1 < m ? pair_rank(ws.ids[i], ws.ids[i + 1], &ws.merged[i]) : kNoMerge;
  }
  if (m <= 48) bpe_small(ws, m);
  else bpe_heap(ws, m);
  for (int32_t i = 0; i >= 0; i = ws.nxt[static_cast<size_t>(i)]) out.push_back(ws.ids[static_cast<size_t>(i)]);
}

void Tokenizer::Impl::encode_text(std::string_view text, Workspace& ws, std::vector<int32_t>& out,
                                  bool use_cache) const {
  if (text.empty()) return;
  std::string_view norm = text;
  if (nfc_normalize_if_needed(text, ws.normalized)) norm = ws.normalized;
  ws.pieces.clear();
  pre.split(norm, ws.pieces);
  constexpr size_t kMaxCachedPiece = 128;
  constexpr size_t kMaxCacheIds = size_t{1} << 22;
  for (std::string_view p : ws.pieces) {
    if (!use_cache || p.size() == 1 || p.size() > kMaxCachedPiece) {
      bpe(p, ws, out);
      continue;
    }
    const std::string key(p);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      const int32_t* src = cache_ids.data() + it->second.first;
      out.insert(out.end(), src, src + it->second.second);
      continue;
    }
    const size_t before = out.size();
    bpe(p, ws, out);
    if (cache_ids.size() > kMaxCacheIds) {  // bounded memory: start over
      cache.clear();
      cache_ids.clear();
    }
    const auto off = static_cast<uint32_t>(cache_ids.size());
    cache_ids.insert(cache_ids.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
    cache.emplace(key, std::make_pair(off, static_cast<uint32_t>(out.size() - before)));
  }
}

// ------------------------------------------------------------------------------------------------
// Encode / decode

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode(text, parse_special, out);
  return out;
}

void Tokenizer::encode(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  if (const auto bad = utf8::first_invalid(text))
    fail("tokenizer: input is not valid UTF-8: byte 0x{:02X} at offset {} (of {}); use utf8::sanitize() to "
         "replace invalid bytes with U+FFFD",
         static_cast<uint8_t>(text[*bad]), *bad, text.size());
  const Impl& m = *impl_;
  Workspace ws;
  std::unique_lock<std::mutex> lk(m.cache_mu, std::try_to_lock);
  const bool use_cache = lk.owns_lock();

  size_t seg = 0;  // start of the pending plain-text stretch
  size_t i = 0;
  const size_t n = text.size();
  const bool have_added = !m.added.empty();
  while (have_added && i < n) {
    const auto b = static_cast<uint8_t>(text[i]);
    const uint16_t lo = m.added_start[b], hi = m.added_start[b + 1u];
    if (lo == hi) {
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (uint16_t k = lo; k < hi; ++k) {
      const AddedToken& t = m.added[k];
      if (t.text.size() <= n - i && std::memcmp(text.data() + i, t.text.data(), t.text.size()) == 0) {
        hit = &t;  // longest first
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (hit->control && !parse_special) {  // matched but not allowed: its text stays plain text
      i += hit->text.size();
      continue;
    }
    m.encode_text(text.substr(seg, i - seg), ws, out, use_cache);
    out.push_back(hit->id);
    i += hit->text.size();
    seg = i;
  }
  m.encode_text(text.substr(seg), ws, out, use_cache);
}

std::vector<std::string> Tokenizer::pretokenize(std::string_view text, bool parse_special) const {
  // Same splitting as encode(), reporting pieces instead of ids; added tokens come out as one piece.
  std::vector<std::string> out;
  const Impl& m = *impl_;
  auto plain = [&](std::string_view t) {
    if (t.empty()) return;
    std::string norm;
    std::string_view v = nfc_normalize_if_needed(t, norm) ? std::string_view(norm) : t;
    for (auto& p : m.pre.split(v)) out.push_back(std::move(p));
  };
  if (utf8::first_invalid(text)) fail("tokenizer: input is not valid UTF-8");
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const auto b = static_cast<uint8_t>(text[i]);
    const AddedToken* hit = nullptr;
    for (uint16_t k = m.added_start[b]; k < m.added_start[b + 1u]; ++k) {
      const AddedToken& t = m.added[k];
      if (text.compare(i, t.text.size(), t.text) == 0) {
        hit = &t;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (hit->control && !parse_special) {
      i += hit->text.size();
      continue;
    }
    plain(text.substr(seg, i - seg));
    out.push_back(hit->text);
    i += hit->text.size();
    seg = i;
  }
  plain(text.substr(seg));
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("tokenizer: token id {} is outside the vocabulary (size {})", id, n_vocab());
  return impl_->raw[static_cast<size_t>(id)];
}

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < n_vocab() &&
         vocab_.token_types[static_cast<size_t>(id)] == static_cast<int32_t>(TokenType::Control);
}

int32_t Tokenizer::token_id(std::string_view bytes) const {
  if (const int32_t id = impl_->by_bytes.find(bytes); id >= 0) return id;
  for (const AddedToken& t : impl_->added)
    if (t.text == bytes) return t.id;
  return -1;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special && is_control(id)) continue;
    out += b;
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// StreamingDecoder

StreamingDecoder::StreamingDecoder(const Tokenizer& tok, bool skip_special) : tok_(&tok), skip_special_(skip_special) {}

void StreamingDecoder::push(int32_t id, std::string& out) {
  const std::string& b = tok_->token_bytes(id);
  if (skip_special_ && tok_->is_control(id)) return;
  pending_ += b;
  const size_t keep = utf8::append_lossy(pending_, out, /*final=*/false);
  pending_.erase(0, pending_.size() - keep);
}

std::string StreamingDecoder::push(int32_t id) {
  std::string out;
  push(id, out);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out;
  utf8::append_lossy(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace bonsai
