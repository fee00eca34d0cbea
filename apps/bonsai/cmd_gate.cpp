// bonsai gate -m PACK --fixture FILE [--tie-band EPS] [--min-agreement A] [--max-delta D] [--max-kl K] [--backend ref|cpu|cuda]
//             [--chunk auto|1|16|64] [--threads N] [--json]
//
// Teacher-forced parity gate (engine/gate.h): every position's logits against the fixture's. Prints per
// prompt and overall: positions, positions counted (reference top-2 margin >= tie band), argmax agreement
// among the counted, max |delta logit|, mean KL(ref || ours). Exits 3 when agreement is below 100% of the
// counted positions (or below --min-agreement, a stated looser bound) or a given bound is exceeded.
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "engine/backends.h"
#include "engine/gate.h"
#include "model/forward.h"
#include "model/pack.h"
#include "util/error.h"

namespace bonsai::cli {

namespace {

struct GateArgs {
  std::string model;
  std::string fixture;
  GateOptions gate;
  std::string backend = "cpu";
  std::string chunk = "auto";
  int threads = 0;
  std::string act;  // --act: activation precision of the ternary products ("": the backend default)
  bool json = false;
};

std::vector<int64_t> chunks_for(const std::string& c) {
  if (c == "auto") return {SessionOptions::kMaxChunk};
  if (c == "1") return {};
  if (c == "16") return {16};
  if (c == "64") return {64};
  fail("--chunk must be auto, 1, 16 or 64, got '{}'", c);
}

void print_row(const GateStats& s) {
  std::printf("%-24s %9lld %9lld %7lld/%-7lld %8.3f%% %14.6g %12.4g\n", s.name.c_str(),
              static_cast<long long>(s.positions), static_cast<long long>(s.counted), static_cast<long long>(s.agree),
              static_cast<long long>(s.counted), 100.0 * s.agreement(), s.max_delta, s.mean_kl());
}

void gate(const GateArgs& a) {
  SessionOptions so;
  so.chunks = chunks_for(a.chunk);
  if (!(a.gate.tie_band >= 0)) fail("--tie-band must be >= 0, got {}", a.gate.tie_band);
  if (!(a.gate.min_agreement >= 0 && a.gate.min_agreement <= 1))
    fail("--min-agreement must be in [0, 1], got {}", a.gate.min_agreement);
  const GateFixture fx = read_gate_fixture(a.fixture);
  LoadOptions lo;
  lo.threads = a.threads;
  const Model model = load_model(a.model, lo);
  BackendOptions bo;
  bo.threads = a.threads;
  bo.activations = a.act;
  bo.exclusive_model = true;  // this command's model serves this backend only
  std::unique_ptr<Backend> backend = make_backend(a.backend, bo);
  Decoder decoder(model, *backend);
  const auto t0 = std::chrono::steady_clock::now();
  const GateReport rep = run_gate(decoder, fx, a.gate, so);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (a.json) {
    auto row = [](const GateStats& s) {
      return nlohmann::ordered_json{{"name", s.name},         {"positions", s.positions}, {"counted", s.counted},
                                    {"agree", s.agree},       {"agreement", s.agreement()},
                                    {"max_delta", s.max_delta}, {"mean_kl", s.mean_kl()}};
    };
    nlohmann::ordered_json j;
    j["pack"] = a.model;
    j["fixture"] = a.fixture;
    j["backend"] = backend->name();
    j["chunk"] = a.chunk;
    j["tie_band"] = a.gate.tie_band;
    j["min_agreement"] = a.gate.min_agreement;
    j["prompts"] = nlohmann::ordered_json::array();
    for (const GateStats& s : rep.prompts) j["prompts"].push_back(row(s));
    j["overall"] = row(rep.overall);
    j["pass"] = rep.pass();
    j["failures"] = rep.failures;
    j["seconds"] = secs;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("gate: %s vs %s, %s backend, chunk %s, tie band %g\n", a.model.c_str(), a.fixture.c_str(),
                backend->name(), a.chunk.c_str(), a.gate.tie_band);
    std::printf("%-24s %9s %9s %15s %9s %14s %12s\n", "prompt", "positions", "counted", "agree", "agreement",
                "max|dlogit|", "mean KL");
    for (const GateStats& s : rep.prompts) print_row(s);
    print_row(rep.overall);
    if (rep.pass()) std::printf("PASS (%.2f s)\n", secs);
    for (const std::string& f : rep.failures) std::printf("FAIL: %s\n", f.c_str());
  }
  if (!rep.pass()) throw ExitCode{3};
}

}  // namespace

void register_gate(CLI::App& app) {
  auto* cmd = app.add_subcommand("gate", "Teacher-forced logit parity of a pack against a fixture (exit 3 on failure)");
  auto a = std::make_shared<GateArgs>();
  cmd->add_option("-m,--model", a->model, "Pack: GGUF file or MLX folder")->required();
  cmd->add_option("--fixture", a->fixture, "Fixture (safetensors: p{i}.tokens I32 [T], p{i}.logits F32 [T, V])")
      ->required();
  cmd->add_option("--tie-band", a->gate.tie_band, "Positions whose reference top-2 margin is below this do not count")
      ->capture_default_str();
  cmd->add_option("--min-agreement", a->gate.min_agreement,
                  "Fail when the argmax agreement among the counted positions is below this fraction (1: every one)")
      ->capture_default_str();
  cmd->add_option("--max-delta", a->gate.max_delta, "Fail when max |delta logit| exceeds this");
  cmd->add_option("--max-kl", a->gate.max_kl, "Fail when the mean KL(ref || ours) exceeds this");
  cmd->add_option("--backend", a->backend, "ref, cpu or cuda")->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "Prefill chunks: auto (the backend's prefill chunk: 64 on the CPU, 2048 on CUDA; then one ragged chunk), 1 (walk), 16, 64")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0: all)")->capture_default_str();
  cmd->add_option("--act", a->act, kActHelp);
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] { gate(*a); });
}

}  // namespace bonsai::cli
