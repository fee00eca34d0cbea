// Model shapes make-pack knows: `tiny` (the real structure at a few MB) and `27b` (the real shapes).
#pragma once
#include <string>

#include "model/config.h"

namespace bonsai {

struct PackPreset {
  std::string name;
  ModelConfig config;       // vocab filled in by make-pack for presets with a tokenizer
  int64_t hadamard_block;   // n of the rotation
  bool float_model;         // tiny: a float model is drawn, folded and ternarised; 27b: random codes
};

// Throws Error listing the known presets.
PackPreset pack_preset(const std::string& name);

}  // namespace bonsai
