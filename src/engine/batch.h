// BatchGenerator: generation for many sequences at once, the live ones stepped together in ONE forward
// per decode step (Decoder::step_batch: the weights stream once per step for all of them).
//
// A request is a prompt plus GenerateOptions (max new tokens, its own sampler and seed, stop ids), with
// exactly generate()'s semantics per sequence: the prompt is prefilled alone with the chunk planner
// (Session::append_kept), the first token is sampled from the prefill's logits, then each decode step feeds
// every live sequence its last token, samples its next one from its own row of logits with its own
// Sampler, and retires it after a stop id (kept in the output) or max_new_tokens tokens.
//
// Scheduling, one step():
//   1. admission: queued requests (submission order) are prefilled while fewer than max_batch are live;
//      a request that finishes on its first token (a stop id, or max_new_tokens <= 1) retires at once;
//   2. one batched decode step of all live sequences, then retirement. When every live row samples
//      greedily (no penalty), the step asks only for each row's argmax (Decoder::step_batch_argmax:
//      a backend with argmax_rows then never copies the [B, V] logits to the host). Otherwise the logits
//      stay on the backend (Decoder::step_batch_kept) and each row is picked there as its sampler allows
//      (pick_next_token: its argmax, its top-k candidates, else that row copied to the host).
// Row order: the live rows are in admission order; a retired row is removed and the rows after it move
// up one (stable compaction; each row's state stays where it is, only its pointer moves). New rows join
// at the end. Retired sessions go to a pool and are reused (reset) by later admissions that fit them.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"

namespace bonsai {

struct BatchOptions {
  // Sequences stepped together at most (1 .. decoder.max_batch()); further requests wait in the queue.
  int64_t max_batch = 32;
  // KV positions per sequence. 0: each sequence gets exactly prompt + max_new_tokens (the least memory);
  // > 0: every sequence gets this many (bounded by the model's context length).
  int64_t capacity = 0;
  // Prefill chunk sizes (SessionOptions::chunks).
  std::vector<int64_t> chunks{SessionOptions::kMaxChunk};
};

struct BatchStats {
  int64_t admitted = 0;           // requests prefilled
  int64_t prompt_tokens = 0;      // over every admitted request
  int64_t decode_steps = 0;       // batched forwards
  int64_t decode_tokens = 0;      // rows over every batched forward (= tokens from decode steps)
  int64_t max_live = 0;           // the largest batch stepped
  double prefill_seconds = 0;     // prefills and first samples
  double decode_seconds = 0;      // batched forwards and their sampling
  uint64_t weight_bytes_per_step = 0;  // Model::decode_weight_bytes(): read once per batched step
  uint64_t state_bytes = 0;       // KV / conv / recurrent bytes moved by every row of every step

  double aggregate_tok_s() const { return decode_seconds > 0 ? double(decode_tokens) / decode_seconds : 0; }
  double steps_per_s() const { return decode_seconds > 0 ? double(decode_steps) / decode_seconds : 0; }
  double mean_batch() const { return decode_steps > 0 ? double(decode_tokens) / double(decode_steps) : 0; }
  // Bytes one step moves on average: the weights once plus every row's state.
  double bytes_per_step() const {
    return decode_steps > 0 ? double(weight_bytes_per_step) + double(state_bytes) / double(decode_steps) : 0;
  }
  double decode_gb_s() const { return decode_seconds > 0 ? bytes_per_step() * double(decode_steps) / decode_seconds / 1e9 : 0; }
};

class BatchGenerator {
 public:
  // Throws bonsai::Error unless 1 <= max_batch <= decoder.max_batch(), capacity >= 0 and within the
  // model's context length, chunks in [1, decoder.max_chunk()]. The decoder must outlive the generator.
  explicit BatchGenerator(Decoder& decoder, BatchOptions opt = {});
  ~BatchGenerator();
  BatchGenerator(const BatchGenerator&) = delete;
  BatchGenerator& operator=(const BatchGenerator&) = delete;

  // Queues a request and returns its id (0, 1, 2, ... in submission order). Checked now, nothing queued
  // on error (bonsai::Error): a non-empty prompt of ids in [0, vocab), max_new_tokens >= 0, prompt +
  // max_new_tokens within the capacity and the context length, valid sampler options.
  int64_t submit(std::span<const int32_t> prompt, const GenerateOptions& opt);

  // One scheduling round (admission, then one batched decode step; see the top of this file). Returns
  // false, doing nothing, when no request is queued or live.
  bool step();
  // step() until every request is done.
  void run();

  // Called as each token is sampled: (request id, token).
  std::function<void(int64_t, int32_t)> on_token;

  // The result of request `id` so far (tokens, stopped, per-sequence stats: prompt_tokens, generated,
  // decode_steps = batched steps it took part in, prefill_seconds, decode_seconds = those steps' time).
  const GenerateResult& result(int64_t id) const;
  bool done(int64_t id) const;
  int64_t queued() const { return int64_t(queue_.size()); }
  int64_t live() const { return int64_t(live_.size()); }
  // Request ids of the live rows, in row order (the order of the next step's logits rows).
  std::vector<int64_t> live_ids() const;
  const BatchStats& stats() const { return stats_; }

 private:
  struct Request {
    int64_t id;
    std::vector<int32_t> prompt;
    GenerateOptions opt;
  };
  struct Seq;  // a live row (batch.cpp)
  void admit(Request& rq);
  // Records a sampled token for s; true when the sequence is finished (stop id or max_new_tokens).
  bool emit(Seq& s, int32_t tok);
  void retire(std::unique_ptr<Seq>& s);
  std::unique_ptr<Session> take_session(int64_t need);

  Decoder& dec_;
  BatchOptions opt_;
  std::deque<Request> queue_;                  // waiting, submission order (front = next)
  std::vector<std::unique_ptr<Seq>> live_;     // [B] the batch rows, admission order
  std::vector<std::unique_ptr<Session>> pool_; // retired sessions, reset, for reuse
  std::vector<GenerateResult> results_;        // [requests] by id
  std::vector<uint8_t> done_;                  // [requests] by id
  std::vector<DecoderState*> states_;          // [max_batch] row b's state, per step
  std::vector<int32_t> ids_;                   // [max_batch] row b's input token, per step
  std::vector<int32_t> next_;                  // [max_batch] row b's argmax, per all-greedy step
  std::vector<uint8_t> finished_;              // [max_batch] row b retires after this step
  PickScratch pick_;                           // the per-row picks of a step with sampling rows
  BatchStats stats_;
};

}  // namespace bonsai
