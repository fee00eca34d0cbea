#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "util/error.h"

namespace bonsai {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateResult generate(Session& session, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(int32_t)>& on_token) {
  if (opt.max_new_tokens < 0) fail("-n must be >= 0, got {}", opt.max_new_tokens);
  session.check_append(prompt, "prompt", opt.max_new_tokens);
  Decoder& dec = session.decoder();
  Sampler sampler(opt.sampling, dec.vocab());

  GenerateResult r;
  r.stats.prompt_tokens = int64_t(prompt.size());
  r.stats.weight_bytes_per_step = dec.model().decode_weight_bytes();
  r.tokens.reserve(size_t(opt.max_new_tokens));
  std::vector<int32_t> seen(prompt.begin(), prompt.end());  // the penalty's history: prompt + generated
  seen.reserve(prompt.size() + size_t(opt.max_new_tokens));
  auto is_stop = [&](int32_t t) { return std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end(); };

  // The logits stay on the backend; Session::next_token picks there when it can (argmax, top-k).
  auto next_after = [&](std::span<const int32_t> ids) {
    session.append_kept(ids);
    return session.next_token(sampler, seen);
  };

  auto t0 = std::chrono::steady_clock::now();
  if (opt.max_new_tokens == 0) {
    session.append_kept(prompt);  // nothing is picked: the logits need not come to the host
    r.stats.prefill_seconds = seconds_since(t0);
    return r;
  }
  int32_t tok = next_after(prompt);
  r.stats.prefill_seconds = seconds_since(t0);

  auto t1 = std::chrono::steady_clock::now();
  for (;;) {
    r.tokens.push_back(tok);
    seen.push_back(tok);
    if (on_token) on_token(tok);
    if (is_stop(tok)) {
      r.stopped = true;
      break;
    }
    if (int64_t(r.tokens.size()) >= opt.max_new_tokens) break;
    r.stats.state_bytes += dec.state_bytes_per_step(session.position());
    tok = next_after(std::span<const int32_t>(&tok, 1));
    ++r.stats.decode_steps;
  }
  r.stats.decode_seconds = r.stats.decode_steps > 0 ? seconds_since(t1) : 0.0;
  r.stats.generated = int64_t(r.tokens.size());
  return r;
}

}  // namespace bonsai
