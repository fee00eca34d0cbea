// bonsai run -m PACK (--tokens 1,2,3 | -p TEXT) -n N [sampling] [--ctx --threads --backend] [--ignore-eos] [--json]
//
// One-shot raw completion (no chat template): prefill the prompt, generate up to N tokens (greedy by
// default), print the generated ids, the decoded text when the pack has a tokenizer, then a footer:
// prompt tokens, prefill tok/s, decode tok/s, ms/token and GB/s = (Model::decode_weight_bytes() + the
// KV / conv / recurrent state bytes a step moves) * decode tok/s.
//
// --chat -p TEXT [--system S] [--think on|off] [--chat-format auto|chatml] [--stop S]...: a chat completion
// instead (cmd_chat.cpp, run_chat_once): the pack's chat template, the answer printed with the reasoning
// apart, the footer on stderr.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "chat_cli.h"
#include "commands.h"
#include "engine/backends.h"
#include "engine/generate.h"
#include "engine/pack_tokenizer.h"
#include "model/forward.h"
#include "model/pack.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace bonsai::cli {

namespace {

struct RunArgs {
  std::string model;
  std::string tokens;
  std::string prompt;
  int64_t n = 16;
  SamplerOptions sampling;
  int64_t ctx = 0;
  int threads = 0;
  std::string act;  // --act: activation precision of the ternary products ("": the backend default)
  std::string backend = "cpu";
  bool json = false;
  bool ignore_eos = false;
  bool chat = false;      // --chat: cmd_chat.cpp renders the chat template and prints the answer
  bool n_given = false;
  ChatCliArgs chat_args;  // --system --think --chat-format ... (--chat only)
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "1,2, 3" -> {1, 2, 3}; anything else is a clear error.
std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    if (item.empty()) fail("--tokens: empty entry at item {} of '{}'", ids.size(), s);
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("--tokens: '{}' (item {}) is not an integer token id", item, ids.size());
    }
    i = j + 1;
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

void run(const RunArgs& a) {
  if (a.chat) {
    if (!a.tokens.empty()) fail("--chat takes the message as -p TEXT, not --tokens");
    ChatCliArgs c = a.chat_args;
    c.model = a.model;
    c.prompt = a.prompt;
    c.n = a.n_given ? a.n : -1;  // a chat reply runs to its stop token unless -n is given
    c.sampling = a.sampling;
    c.ctx = a.ctx;
    c.threads = a.threads;
    c.act = a.act;
    c.backend = a.backend;
    c.json = a.json;
    c.ignore_eos = a.ignore_eos;
    run_chat_once(c);
    return;
  }
  if (a.tokens.empty() == a.prompt.empty()) fail("give exactly one of --tokens and -p/--prompt");
  auto t_load = std::chrono::steady_clock::now();
  Pack pack = open_pack(a.model);
  std::unique_ptr<Tokenizer> tok = load_pack_tokenizer(pack);
  std::vector<int32_t> prompt;
  if (!a.tokens.empty()) {
    prompt = parse_token_list(a.tokens);
  } else {
    if (!tok) fail("{}: the pack has no tokenizer; give the prompt as --tokens", a.model);
    prompt = tok->encode(a.prompt);
    if (prompt.empty()) fail("-p: the prompt encodes to no tokens");
  }
  LoadOptions lo;
  lo.threads = a.threads;
  const Model model = load_model(pack, lo);
  BackendOptions bo;
  bo.threads = a.threads;
  bo.activations = a.act;
  bo.exclusive_model = true;  // this command's model serves this backend only
  std::unique_ptr<Backend> backend = make_backend(a.backend, bo);
  Decoder decoder(model, *backend);
  SessionOptions so;
  so.capacity = a.ctx;
  Session session(decoder, so);
  const double load_s = seconds_since(t_load);

  GenerateOptions go;
  go.max_new_tokens = a.n;
  go.sampling = a.sampling;
  if (tok && !a.ignore_eos) go.stop_ids = tok->vocab().stop_ids();
  const GenerateResult r = generate(session, prompt, go);

  std::string text;
  if (tok) {
    std::vector<int32_t> shown;
    for (size_t i = 0; i < r.tokens.size(); ++i)
      if (!(r.stopped && i + 1 == r.tokens.size()) && r.tokens[i] < tok->n_vocab()) shown.push_back(r.tokens[i]);
    text = utf8::sanitize(tok->decode(shown));
  }
  const GenerateStats& s = r.stats;
  const uint64_t state_per_step = s.decode_steps ? s.state_bytes / uint64_t(s.decode_steps) : 0;
  const auto* cpu = dynamic_cast<const CpuBackend*>(backend.get());
  const int threads = cpu ? cpu->threads() : 1;

  if (a.json) {
    nlohmann::ordered_json j;
    j["prompt_tokens"] = prompt;
    j["tokens"] = r.tokens;
    if (tok) j["text"] = text;
    j["stopped"] = r.stopped;
    j["backend"] = backend->name();
    j["threads"] = threads;
    if (cpu) {  // the CPU backend: its kernel variant and activation precision
      j["cpu_kernels"] = cpu::kernels_name();
      j["cpu_activation"] = cpu::activation_name(cpu::ternary_activation());
    }
    j["stats"] = {{"prompt_tokens", s.prompt_tokens},
                  {"generated", s.generated},
                  {"decode_steps", s.decode_steps},
                  {"load_seconds", load_s},
                  {"prefill_seconds", s.prefill_seconds},
                  {"decode_seconds", s.decode_seconds},
                  {"prefill_tok_s", s.prefill_tok_s()},
                  {"decode_tok_s", s.decode_tok_s()},
                  {"ms_per_token", s.ms_per_token()},
                  {"weight_bytes_per_token", s.weight_bytes_per_step},
                  {"state_bytes_per_token", state_per_step},
                  {"decode_gb_s", s.decode_gb_s()}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("tokens: %s\n", join_ids(r.tokens).c_str());
  if (tok) std::printf("text: %s\n", text.c_str());
  std::printf("-- prompt %lld tokens | prefill %.3f s, %.1f tok/s | ", static_cast<long long>(s.prompt_tokens),
              s.prefill_seconds, s.prefill_tok_s());
  if (s.decode_steps > 0)
    std::printf("decode %lld tokens, %.2f tok/s, %.2f ms/token | %.2f GB/s (%.2f MB weights + %.3f MB state per token)",
                static_cast<long long>(s.decode_steps), s.decode_tok_s(), s.ms_per_token(), s.decode_gb_s(),
                double(s.weight_bytes_per_step) / 1e6, double(state_per_step) / 1e6);
  else
    std::printf("decode - (one token or fewer generated)");
  // The CPU kernel variant the runtime dispatch chose and the ternary activation precision (issue 4: the choice is
  // printed), e.g. "cpu backend, 2 threads, avx2 kernels, q16 activations".
  const std::string kernels = cpu ? std::string(", ") + cpu::kernels_name() + " kernels, " +
                                                 cpu::activation_name(cpu::ternary_activation()) + " activations"
                                           : std::string();
  std::printf(" | %s backend, %d thread%s%s | load %.2f s%s\n", backend->name(), threads, threads == 1 ? "" : "s",
              kernels.c_str(), load_s, r.stopped ? " | stopped on a stop id" : "");
}

}  // namespace

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate a raw completion of a prompt (token ids or text) with a pack");
  auto a = std::make_shared<RunArgs>();
  cmd->add_option("-m,--model", a->model, "Pack: GGUF file or MLX folder")->required();
  auto* t = cmd->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids");
  auto* p = cmd->add_option("-p,--prompt", a->prompt, "Prompt text (encoded with the pack's tokenizer; no chat template unless --chat)");
  t->excludes(p);
  auto* n_opt = cmd->add_option("-n,--n-predict", a->n, "Tokens to generate (--chat: until a stop token unless given)")
                    ->capture_default_str();
  cmd->add_option("--temp", a->sampling.temperature, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", a->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", a->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str();
  cmd->add_option("--repeat-last-n", a->sampling.repeat_last_n, "Tokens the penalty looks back (-1: all)")
      ->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--ctx", a->ctx, "KV capacity in tokens (0: min(context length, 4096))")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0: all)")->capture_default_str();
  cmd->add_option("--act", a->act, kActHelp);
  cmd->add_option("--backend", a->backend, "ref (fp64 reference, slow), cpu or cuda")->capture_default_str();
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop on the pack's stop ids (benchmarking)");
  cmd->add_flag("--json", a->json, "Print JSON");
  auto* chat = cmd->add_flag("--chat", a->chat,
                             "Chat completion: -p is a user message rendered with the pack's chat template; prints the "
                             "answer (reasoning apart)");
  for (CLI::Option* o : add_chat_options(cmd, a->chat_args, /*multi_turn=*/false)) o->needs(chat);
  cmd->callback([a, n_opt] {
    a->n_given = n_opt->count() > 0;
    run(*a);
  });
}

}  // namespace bonsai::cli
