// Session: one sequence being decoded. It owns the per-layer state (a KV cache per attention layer, conv
// and recurrent state per GDN layer, see model/forward.h), the position and the token history, and
// appends tokens without re-running the history. Several sessions can share one Decoder (one model, one
// backend), stepped one after the other or together in one forward (BatchGenerator, engine/batch.h).
//
// Prefill planner: a prompt of n tokens is fed as the largest chunk that fits, repeatedly, and a rest shorter
// than every chunk as ONE ragged chunk. By default the only chunk is the decoder's max_chunk: 125 tokens at 64
// = 64 + 61, 512 = 8 x 64, a 200-token chat turn on CUDA (2048) one chunk of 200. Round 18: the default was
// {max_chunk, 16}, so every prompt shorter than max_chunk ran as 16-token forwards, each streaming all the weights
// (27b on the H200: pp100 1,271 -> 4,277 tok/s; on the CPU pp60 unchanged, its 16-token GEMMs are compute-bound).
// Explicit lists keep the old form: with chunks {64, 16}, 125 = 64 + 16 + 16 + 16 + 13.
// The last chunk's last row yields the next-token logits (LogitsMode::Last). Why not the Apple host's plan
// (the spec's "64 + 16 + 16 + 16 + 13 walked", the last token a step of its own): its compiled graphs took
// fixed query lengths, ours take any M, and a walked token costs ~1.4x a chunked one on the CPU (pp512
// walked 16 of its tokens, ~4% of the time).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "model/forward.h"

namespace bonsai {

struct SessionOptions {
  // KV positions the session can hold (prompt + generated). 0: min(context_length, kDefaultCapacity).
  // Must not exceed the model's context length.
  int64_t capacity = 0;
  // Prefill chunk sizes, each <= the decoder's max_chunk (sorted largest first). Empty: walk every token.
  // kMaxChunk stands for the decoder's max_chunk() (by default the backend's prefill chunk: 64 on the
  // CPU, 2048 on CUDA).
  static constexpr int64_t kMaxChunk = -1;
  std::vector<int64_t> chunks{kMaxChunk};
};

// The next step when `left` tokens remain: the first (= largest) chunk c of `chunks` (largest first) with
// c <= left, else `left` itself (one ragged chunk; 0 when nothing is left). With no chunks: 1 (walk).
int64_t next_prefill_step(int64_t left, std::span<const int64_t> chunks);
// Every step size (summing to n) in which n tokens are fed.
std::vector<int64_t> plan_prefill(int64_t n, std::span<const int64_t> chunks);
// `chunks` with SessionOptions::kMaxChunk replaced by max_chunk, sorted largest first, duplicates removed;
// throws bonsai::Error (prefixed by `who`) for a chunk outside [1, max_chunk].
std::vector<int64_t> resolve_chunks(std::vector<int64_t> chunks, int64_t max_chunk, const char* who);

// pick_next_token's buffers (reused: no allocation per token once warm).
struct PickScratch {
  std::vector<int32_t> penalized;  // the penalty window's distinct tokens
  std::vector<int32_t> ids;        // [top_k_wanted] the backend's candidates
  std::vector<float> values;       // [top_k_wanted] their (penalised) logits
  std::vector<float> logits;       // [V] the host copy of the row, when neither pick applies
};

// The next token from row `row` of the decoder's kept logits (Decoder::forward_kept, step_batch_kept):
// exactly the one sampler.sample(that row, history) picks, with the same draws from its random stream, by
// the cheapest route the backend has: its argmax for a plain-argmax sampler (one id crosses to the host),
// its top-k candidates (Backend::top_k, for Sampler::top_k_wanted() of them), else the row copied to the
// host. Once per row and forward (the top-k route applies the penalty to the kept row in place).
int32_t pick_next_token(Decoder& dec, int64_t row, Sampler& sampler, std::span<const int32_t> history,
                        PickScratch& scratch);

class Session {
 public:
  static constexpr int64_t kDefaultCapacity = 4096;

  // Throws bonsai::Error when the capacity exceeds the model's context length or a chunk size is not
  // in [1, decoder.max_chunk()].
  explicit Session(Decoder& decoder, SessionOptions opt = {});

  Decoder& decoder() const { return *dec_; }
  int64_t position() const { return state_.pos; }
  int64_t capacity() const { return state_.capacity; }
  int64_t remaining() const { return state_.capacity - state_.pos; }
  const std::vector<int32_t>& history() const { return history_; }
  const DecoderState& state() const { return state_; }
  const SessionOptions& options() const { return opt_; }

  // Throws bonsai::Error with a clear message unless `tokens` (non-empty, called `what` in messages)
  // can be appended: every id in [0, vocab) and position() + size + extra <= capacity() (`extra`: more
  // positions the caller will need after these, e.g. the tokens it is about to generate).
  void check_append(std::span<const int32_t> tokens, const char* what = "prompt", int64_t extra = 0) const;

  // Appends tokens after the history (prefill planner) and returns the logits after the last of them,
  // fp32 [V], valid until the next call. Checks first (check_append); nothing runs on error.
  std::span<const float> append(std::span<const int32_t> tokens);
  // append() that keeps the logits after the last token on the backend (Decoder::forward_kept) for
  // next_token, instead of copying them to the host. Same checks as append.
  void append_kept(std::span<const int32_t> tokens);
  // The next token from the kept logits (pick_next_token, row 0). Once per append_kept.
  int32_t next_token(Sampler& sampler, std::span<const int32_t> history);
  // Teacher-forced: appends tokens and writes the logits after every one of them, host fp32 [n, V]
  // (row t = after consuming tokens[0..t]).
  void append_all(std::span<const int32_t> tokens, float* logits);
  // Empty sequence again (state zeroed, position 0, history cleared); the KV memory is kept.
  void reset();

 private:
  friend class BatchGenerator;  // steps several sessions in one forward (engine/batch.h)
  // The prefill planner's steps over tokens (checked); the last step's logits into logits_, or (keep) kept
  // on the backend.
  void feed(std::span<const int32_t> tokens, bool keep);
  Decoder* dec_;
  SessionOptions opt_;
  DecoderState state_;
  std::vector<int32_t> history_;
  std::vector<float> logits_;  // [V]
  PickScratch pick_;           // next_token's
};

}  // namespace bonsai
