// The parity gate: teacher-forced logits of every position against a fixture (the HuggingFace reference,
// tools/reference/, or any other run), with a tie band (DESIGN.md numerics contract).
//
// Fixture file (safetensors): for each prompt i = 0..n-1
//   "p{i}.tokens" I32 [T]      the token ids
//   "p{i}.logits" F32 [T, V]   row t = logits after consuming tokens[0..t] (predicting token t+1)
// metadata "prompts" = n, "names" = JSON list of n names, plus free-form provenance keys.
//
// Per prompt and overall: positions; positions counted (reference top-2 margin >= tie band); argmax
// agreement among the counted; max |delta logit| over every position and vocabulary entry; mean over
// positions of KL(ref || ours) (softmax in double).
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/session.h"

namespace bonsai {

struct GatePrompt {
  std::string name;
  std::vector<int32_t> tokens;  // [T]
  std::vector<float> logits;    // [T, V]
};

struct GateFixture {
  int64_t vocab = 0;
  std::vector<GatePrompt> prompts;
  std::map<std::string, std::string> metadata;  // every metadata key of the file (provenance)
};

// Throws bonsai::Error naming the file and the tensor / key on any inconsistency.
GateFixture read_gate_fixture(const std::string& path);
// Writes the format above; `metadata` adds provenance keys ("prompts" and "names" are set here).
void write_gate_fixture(const std::string& path, const GateFixture& f);

struct GateOptions {
  double tie_band = 1e-3;                                     // --tie-band
  double min_agreement = 1.0;  // --min-agreement: argmax agreement among the counted positions (1: every one; a
                               // stated looser bound, e.g. CPU q8 activations' 0.95, README "Parity")
  double max_delta = std::numeric_limits<double>::infinity();  // --max-delta
  double max_kl = std::numeric_limits<double>::infinity();     // --max-kl
};

struct GateStats {
  std::string name;
  int64_t positions = 0;
  int64_t counted = 0;     // reference top-2 margin >= tie band
  int64_t agree = 0;       // argmax(ours) == argmax(ref) among the counted
  double max_delta = 0;    // max |ours - ref|
  double sum_kl = 0;       // sum over positions of KL(ref || ours)
  double mean_kl() const { return positions ? sum_kl / double(positions) : 0.0; }
  double agreement() const { return counted ? double(agree) / double(counted) : 1.0; }
  void add(const GateStats& o);
};

// Accumulates T rows of [V] logits into `s`.
void gate_compare(const float* ref, const float* ours, int64_t T, int64_t V, double tie_band, GateStats& s);

struct GateReport {
  std::vector<GateStats> prompts;
  GateStats overall;
  std::vector<std::string> failures;  // empty: pass
  bool pass() const { return failures.empty(); }
};

// Runs every prompt teacher-forced in a fresh session (session options: chunks, capacity >= the longest
// prompt) and compares. Throws when the fixture does not fit the model (vocabulary size, token ids,
// prompt longer than the context).
GateReport run_gate(Decoder& decoder, const GateFixture& fixture, const GateOptions& opt,
                    const SessionOptions& session_opt);

}  // namespace bonsai
