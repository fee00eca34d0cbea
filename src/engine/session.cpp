#include "engine/session.h"

#include <algorithm>

#include "util/error.h"

namespace bonsai {

std::vector<int64_t> plan_prefill(int64_t n, std::span<const int64_t> chunks) {
  std::vector<int64_t> steps;
  int64_t left = n;
  for (int64_t c : chunks)
    while (c > 1 && left - c >= 1) {
      steps.push_back(c);
      left -= c;
    }
  for (; left > 0; --left) steps.push_back(1);
  return steps;
}

Session::Session(Decoder& decoder, SessionOptions opt) : dec_(&decoder), opt_(std::move(opt)) {
  const ModelConfig& c = dec_->model().config;
  const int64_t ctx = c.context_length > 0 ? c.context_length : kDefaultCapacity;
  int64_t cap = opt_.capacity;
  if (cap < 0) fail("KV capacity (--ctx) must be positive, got {}", cap);
  if (cap == 0) cap = std::min(ctx, kDefaultCapacity);
  if (cap > ctx) fail("KV capacity (--ctx) of {} positions exceeds the model's context length of {}", cap, ctx);
  std::sort(opt_.chunks.begin(), opt_.chunks.end(), std::greater<>());
  for (int64_t ch : opt_.chunks)
    if (ch < 1 || ch > dec_->max_chunk())
      fail("prefill chunk of {} tokens: chunks must be in [1, {}]", ch, dec_->max_chunk());
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

std::span<const float> Session::append(std::span<const int32_t> tokens) {
  check_append(tokens);
  const std::vector<int64_t> steps = plan_prefill(int64_t(tokens.size()), opt_.chunks);
  size_t off = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool last = i + 1 == steps.size();
    dec_->forward(state_, tokens.data() + off, steps[i], last ? LogitsMode::Last : LogitsMode::None,
                  last ? logits_.data() : nullptr);
    history_.insert(history_.end(), tokens.begin() + ptrdiff_t(off), tokens.begin() + ptrdiff_t(off + size_t(steps[i])));
    off += size_t(steps[i]);
  }
  return logits_;
}

void Session::append_all(std::span<const int32_t> tokens, float* logits) {
  check_append(tokens);
  const std::vector<int64_t> steps = plan_prefill(int64_t(tokens.size()), opt_.chunks);
  const size_t V = size_t(dec_->vocab());
  size_t off = 0;
  for (int64_t m : steps) {
    dec_->forward(state_, tokens.data() + off, m, LogitsMode::All, logits + off * V);
    history_.insert(history_.end(), tokens.begin() + ptrdiff_t(off), tokens.begin() + ptrdiff_t(off + size_t(m)));
    off += size_t(m);
  }
}

void Session::reset() {
  dec_->reset(state_);
  history_.clear();
}

}  // namespace bonsai
