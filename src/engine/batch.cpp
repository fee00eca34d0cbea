#include "engine/batch.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"

namespace bonsai {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// A live row: one sequence between its prefill and its last token.
struct BatchGenerator::Seq {
  int64_t id = 0;
  std::unique_ptr<Session> session;
  Sampler sampler;
  GenerateOptions opt;
  std::vector<int32_t> seen;  // the penalty's history: prompt + generated
  int32_t next = 0;           // the token this row feeds at the next step (the last one sampled)
  // Its sampler is a plain argmax of the logits (greedy or top-k 1, no penalty: Sampler::sample's
  // shortcut), so a step of such rows only needs each row's argmax (Decoder::step_batch_argmax).
  bool plain_argmax = false;

  Seq(int64_t id_, std::unique_ptr<Session> s, const GenerateOptions& o, int64_t vocab)
      : id(id_), session(std::move(s)), sampler(o.sampling, vocab), opt(o) {
    plain_argmax = sampler.plain_argmax();
  }
};

BatchGenerator::BatchGenerator(Decoder& decoder, BatchOptions opt) : dec_(decoder), opt_(std::move(opt)) {
  if (opt_.max_batch < 1 || opt_.max_batch > dec_.max_batch())
    fail("batch: at most {} sequences can be stepped together here (1..{}), got {}", opt_.max_batch, dec_.max_batch(),
         opt_.max_batch);
  const int64_t ctx = dec_.model().config.context_length;
  if (opt_.capacity < 0) fail("batch: KV capacity must be >= 0, got {}", opt_.capacity);
  if (ctx > 0 && opt_.capacity > ctx)
    fail("batch: KV capacity of {} positions exceeds the model's context length of {}", opt_.capacity, ctx);
  opt_.chunks = resolve_chunks(std::move(opt_.chunks), dec_.max_chunk(), "batch: ");
  const size_t B = size_t(opt_.max_batch);
  states_.resize(B);
  ids_.resize(B);
  next_.resize(B);
  finished_.resize(B);
  live_.reserve(B);
}

BatchGenerator::~BatchGenerator() = default;

int64_t BatchGenerator::submit(std::span<const int32_t> prompt, const GenerateOptions& opt) {
  const int64_t V = dec_.vocab(), n = int64_t(prompt.size()), id = int64_t(results_.size());
  if (n == 0) fail("batch request {}: the prompt is empty: nothing to run", id);
  for (int64_t i = 0; i < n; ++i)
    if (prompt[size_t(i)] < 0 || prompt[size_t(i)] >= V)
      fail("batch request {}: prompt token {} is id {}, outside the vocabulary [0, {})", id, i, prompt[size_t(i)], V);
  if (opt.max_new_tokens < 0) fail("batch request {}: -n must be >= 0, got {}", id, opt.max_new_tokens);
  const int64_t need = n + opt.max_new_tokens, ctx = dec_.model().config.context_length;
  if (ctx > 0 && need > ctx)
    fail("batch request {}: the prompt ({} tokens) plus {} new tokens needs {} positions, past the model's context "
         "length of {}",
         id, n, opt.max_new_tokens, need, ctx);
  if (opt_.capacity > 0 && need > opt_.capacity)
    fail("batch request {}: the prompt ({} tokens) plus {} new tokens needs {} positions, past the KV capacity of {}",
         id, n, opt.max_new_tokens, need, opt_.capacity);
  (void)Sampler(opt.sampling, 1);  // throws on invalid sampling options, before anything is queued

  queue_.push_back(Request{id, std::vector<int32_t>(prompt.begin(), prompt.end()), opt});
  results_.emplace_back();
  results_.back().stats.prompt_tokens = n;
  results_.back().stats.weight_bytes_per_step = dec_.model().decode_weight_bytes();
  done_.push_back(0);
  return id;
}

const GenerateResult& BatchGenerator::result(int64_t id) const {
  if (id < 0 || id >= int64_t(results_.size())) fail("batch: no request {} (0..{})", id, int64_t(results_.size()) - 1);
  return results_[size_t(id)];
}

bool BatchGenerator::done(int64_t id) const {
  (void)result(id);
  return done_[size_t(id)] != 0;
}

std::vector<int64_t> BatchGenerator::live_ids() const {
  std::vector<int64_t> ids;
  for (const auto& s : live_) ids.push_back(s->id);
  return ids;
}

std::unique_ptr<Session> BatchGenerator::take_session(int64_t need) {
  const int64_t cap = opt_.capacity > 0 ? opt_.capacity : need;
  for (size_t i = 0; i < pool_.size(); ++i) {
    if (pool_[i]->capacity() >= need) {
      std::unique_ptr<Session> s = std::move(pool_[i]);
      pool_.erase(pool_.begin() + std::ptrdiff_t(i));
      return s;
    }
  }
  // None fits: free one pooled session first, so the sessions alive never exceed the most rows ever live.
  if (!pool_.empty()) pool_.pop_back();
  SessionOptions so;
  so.capacity = cap;
  so.chunks = opt_.chunks;
  return std::make_unique<Session>(dec_, so);
}

bool BatchGenerator::emit(Seq& s, int32_t tok) {
  GenerateResult& r = results_[size_t(s.id)];
  r.tokens.push_back(tok);
  s.seen.push_back(tok);
  s.next = tok;
  r.stats.generated = int64_t(r.tokens.size());
  if (on_token) on_token(s.id, tok);
  if (std::find(s.opt.stop_ids.begin(), s.opt.stop_ids.end(), tok) != s.opt.stop_ids.end()) {
    r.stopped = true;
    return true;
  }
  return int64_t(r.tokens.size()) >= s.opt.max_new_tokens;
}

void BatchGenerator::retire(std::unique_ptr<Seq>& s) {
  done_[size_t(s->id)] = 1;
  s->session->reset();
  pool_.push_back(std::move(s->session));
  s.reset();
}

void BatchGenerator::admit(Request& rq) {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t n = int64_t(rq.prompt.size());
  auto seq = std::make_unique<Seq>(rq.id, take_session(n + rq.opt.max_new_tokens), rq.opt, dec_.vocab());
  seq->seen = std::move(rq.prompt);
  seq->seen.reserve(size_t(n + rq.opt.max_new_tokens));
  results_[size_t(rq.id)].tokens.reserve(size_t(rq.opt.max_new_tokens));  // no allocation while stepping
  seq->session->append_kept(seq->seen);  // the first token is picked where the logits are (next_token)
  ++stats_.admitted;
  stats_.prompt_tokens += n;
  bool finished = rq.opt.max_new_tokens == 0;
  if (!finished) finished = emit(*seq, seq->session->next_token(seq->sampler, seq->seen));
  const double s = seconds_since(t0);
  stats_.prefill_seconds += s;
  results_[size_t(rq.id)].stats.prefill_seconds = s;
  if (finished) retire(seq);
  else live_.push_back(std::move(seq));
}

bool BatchGenerator::step() {
  if (queue_.empty() && live_.empty()) return false;
  while (!queue_.empty() && int64_t(live_.size()) < opt_.max_batch) {
    Request rq = std::move(queue_.front());
    queue_.pop_front();
    admit(rq);
  }
  const int64_t B = int64_t(live_.size());
  if (B == 0) return true;  // every admitted request finished on its first token

  auto t0 = std::chrono::steady_clock::now();
  bool all_argmax = true;
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = *live_[size_t(b)];
    states_[size_t(b)] = &s.session->state_;
    ids_[size_t(b)] = s.next;
    all_argmax &= s.plain_argmax;
    stats_.state_bytes += dec_.state_bytes_per_step(s.session->position());
  }
  // Every row greedy: only the argmaxes come back, in one call. Otherwise the logits stay on the backend and
  // each row is picked there as its sampler allows (pick_next_token: its argmax, its top-k, else its row).
  if (all_argmax) dec_.step_batch_argmax(states_.data(), ids_.data(), B, next_.data());
  else dec_.step_batch_kept(states_.data(), ids_.data(), B);
  bool any_finished = false;
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = *live_[size_t(b)];
    s.session->history_.push_back(ids_[size_t(b)]);
    const int32_t tok = all_argmax ? next_[size_t(b)] : pick_next_token(dec_, b, s.sampler, s.seen, pick_);
    finished_[size_t(b)] = emit(s, tok);
    any_finished |= finished_[size_t(b)] != 0;
  }
  const double sec = seconds_since(t0);
  ++stats_.decode_steps;
  stats_.decode_tokens += B;
  stats_.max_live = std::max(stats_.max_live, B);
  stats_.decode_seconds += sec;
  stats_.weight_bytes_per_step = dec_.model().decode_weight_bytes();
  for (int64_t b = 0; b < B; ++b) {
    GenerateStats& st = results_[size_t(live_[size_t(b)]->id)].stats;
    ++st.decode_steps;
    st.decode_seconds += sec;
    st.state_bytes += dec_.state_bytes_per_step(live_[size_t(b)]->session->position() - 1);
    if (finished_[size_t(b)]) retire(live_[size_t(b)]);  // leaves a null row, compacted below
  }
  if (any_finished) std::erase(live_, nullptr);  // stable: the remaining rows keep their order
  return true;
}

void BatchGenerator::run() {
  while (step()) {
  }
}

}  // namespace bonsai
