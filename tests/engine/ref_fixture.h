// A gate fixture produced with the reference backend on the tiny pack (two prompts: 15 tokens of encoded
// text, 70 random ids), each prompt as one chunk (WY-form delta rule, attention_prefill), written once
// per ctest run next to the tiny packs and shared by the engine and CLI tests. Until tools/reference/ lands its HuggingFace fixture, this is what the gate is tested against.
#pragma once
#include "backend/ref/ref_backend.h"
#include "engine/gate.h"
#include "engine/pack_tokenizer.h"
#include "engine_test_util.h"

namespace bonsai::testing_support {

inline std::string ref_fixture_path() {
  static const std::string path = [] {
    const std::string p = tiny_packs().dir + "/ref_fixture.safetensors";
    const int lock = open((p + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
    flock(lock, LOCK_EX);
    if (!std::filesystem::exists(p)) {
      const Pack pack = open_pack(tiny_packs().pq2);
      const auto tok = load_pack_tokenizer(pack);
      const Model m = load_model(pack);
      RefBackend rb;
      Decoder dec(m, rb, 128);  // each prompt in one chunk: the fastest way on ref
      GateFixture fx;
      fx.vocab = dec.vocab();
      fx.metadata["producer"] = "bonsai RefBackend (tests/engine/ref_fixture.h)";
      fx.metadata["pack"] = "tiny, seed 7, PQ2_0";
      fx.prompts.push_back({"text", tok->encode("The capital of France is Paris. The quick brown fox"), {}});
      fx.prompts.push_back({"random", test_tokens(70, dec.vocab(), 31), {}});  // > 64: chunk modes differ
      for (GatePrompt& gp : fx.prompts) {
        const int64_t T = int64_t(gp.tokens.size());
        gp.logits.resize(size_t(T * fx.vocab));
        DecoderState s = dec.new_state(T);
        dec.forward(s, gp.tokens.data(), T, LogitsMode::All, gp.logits.data());
      }
      write_gate_fixture(p, fx);
    }
    flock(lock, LOCK_UN);
    close(lock);
    return p;
  }();
  return path;
}

}  // namespace bonsai::testing_support
