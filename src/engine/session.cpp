#include "engine/session.h"

#include <algorithm>

#include "util/error.h"

namespace bonsai {

int64_t next_prefill_step(int64_t left, std::span<const int64_t> chunks) {
  if (left <= 0) return 0;
  bool any = false;
  for (int64_t c : chunks) {
    if (c <= 1) continue;
    any = true;
    if (c <= left) return c;
  }
  return any ? left : 1;
}

std::vector<int64_t> plan_prefill(int64_t n, std::span<const int64_t> chunks) {
  std::vector<int64_t> steps;
  for (int64_t left = n; left > 0;) {
    const int64_t m = next_prefill_step(left, chunks);
    steps.push_back(m);
    left -= m;
  }
  return steps;
}

std::vector<int64_t> resolve_chunks(std::vector<int64_t> chunks, int64_t max_chunk, const char* who) {
  for (int64_t& ch : chunks) {
    if (ch == SessionOptions::kMaxChunk) ch = max_chunk;
    if (ch < 1 || ch > max_chunk) fail("{}prefill chunk of {} tokens: chunks must be in [1, {}]", who, ch, max_chunk);
  }
  std::sort(chunks.begin(), chunks.end(), std::greater<>());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  return chunks;
}

Session::Session(Decoder& decoder, SessionOptions opt) : dec_(&decoder), opt_(std::move(opt)) {
  const ModelConfig& c = dec_->model().config;
  const int64_t ctx = c.context_length > 0 ? c.context_length : kDefaultCapacity;
  int64_t cap = opt_.capacity;
  if (cap < 0) fail("KV capacity (--ctx) must be positive, got {}", cap);
  if (cap == 0) cap = std::min(ctx, kDefaultCapacity);
  if (cap > ctx) fail("KV capacity (--ctx) of {} positions exceeds the model's context length of {}", cap, ctx);
  opt_.chunks = resolve_chunks(std::move(opt_.chunks), dec_->max_chunk(), "");
  state_ = dec_->new_state(cap);
  logits_.resize(size_t(dec_->vocab()));
  history_.reserve(size_t(cap));
}

void Session::check_append(std::span<const int32_t> tokens, const char* what, int64_t extra) const {
  const int64_t V = dec_->vocab(), n = int64_t(tokens.size());
  if (n == 0) fail("the {} is empty: nothing to run", what);
  for (int64_t i = 0; i < n; ++i)
    if (tokens[size_t(i)] < 0 || tokens[size_t(i)] >= V)
      fail("{} token {} is id {}, outside the vocabulary [0, {})", what, i, tokens[size_t(i)], V);
  const int64_t ctx = dec_->model().config.context_length;
  if (position() + n > capacity()) {
    if (ctx > 0 && position() + n > ctx)
      fail("the {} ({} tokens at position {}) is longer than the model's context length of {} tokens", what, n,
           position(), ctx);
    fail("the {} ({} tokens at position {}) does not fit the KV capacity of {} positions (raise --ctx, up to {})", what,
         n, position(), capacity(), ctx);
  }
  if (position() + n + extra > capacity())
    fail("the {} ({} tokens at position {}) plus {} more tokens needs {} positions, past the KV capacity of {} "
         "(lower -n or raise --ctx, up to the context length {})",
         what, n, position(), extra, position() + n + extra, capacity(), ctx);
}

void Session::feed(std::span<const int32_t> tokens, bool keep) {
  check_append(tokens);
  const int64_t n = int64_t(tokens.size());
  for (int64_t off = 0; off < n;) {  // the planner, step by step (no allocation on the decode path)
    const int64_t m = next_prefill_step(n - off, opt_.chunks);
    const int32_t* ids = tokens.data() + off;
    if (off + m < n) dec_->forward(state_, ids, m, LogitsMode::None, nullptr);
    else if (keep) dec_->forward_kept(state_, ids, m);
    else dec_->forward(state_, ids, m, LogitsMode::Last, logits_.data());
    history_.insert(history_.end(), tokens.begin() + off, tokens.begin() + off + m);
    off += m;
  }
}

std::span<const float> Session::append(std::span<const int32_t> tokens) {
  feed(tokens, false);
  return logits_;
}

void Session::append_kept(std::span<const int32_t> tokens) { feed(tokens, true); }

int32_t pick_next_token(Decoder& dec, int64_t row, Sampler& sampler, std::span<const int32_t> history,
                        PickScratch& scratch) {
  if (sampler.plain_argmax()) return dec.kept_argmax(row);
  bool penalised = false;  // the backend applied the penalty to the kept row
  if (const int32_t k = sampler.top_k_wanted(); k > 0) {
    sampler.penalized_tokens(history, scratch.penalized);
    scratch.ids.resize(size_t(k));
    scratch.values.resize(size_t(k));
    const int64_t count = dec.kept_top_k(k, sampler.options().repeat_penalty, scratch.penalized, scratch.ids.data(),
                                         scratch.values.data(), row);
    // sample() orders only its top k, and only when the row has more than k candidates (else its own order)
    if (count > k || (k == 1 && count >= 1)) return sampler.sample_top_k(scratch.ids, scratch.values);
    penalised = count >= 0;
  }
  scratch.logits.resize(size_t(dec.vocab()));
  dec.kept_logits(scratch.logits.data(), row);
  return sampler.sample(scratch.logits, penalised ? std::span<const int32_t>() : history);
}

int32_t Session::next_token(Sampler& sampler, std::span<const int32_t> history) {
  return pick_next_token(*dec_, 0, sampler, history, pick_);
}

void Session::append_all(std::span<const int32_t> tokens, float* logits) {
  check_append(tokens);
  const int64_t n = int64_t(tokens.size());
  const size_t V = size_t(dec_->vocab());
  for (int64_t off = 0; off < n;) {
    const int64_t m = next_prefill_step(n - off, opt_.chunks);
    dec_->forward(state_, tokens.data() + off, m, LogitsMode::All, logits + size_t(off) * V);
    history_.insert(history_.end(), tokens.begin() + off, tokens.begin() + off + m);
    off += m;
  }
}

void Session::reset() {
  dec_->reset(state_);
  history_.clear();
}

}  // namespace bonsai
