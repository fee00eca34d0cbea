// The `prism.hadamard.*` contract (GGUF keys; the MLX pack's hadamard.json holds the same keys and
// values): which linears have R = H_n S / sqrt(n) folded into their weights, the block size n and the
// per-width sign vectors S. Parsing checks each key's presence, type and value rule by rule
// (FACTS section 2); the checks against the tensor inventory live in the loader, which knows the tensors.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bonsai {

class GgufFile;
class GgufWriter;

struct HadamardContract {
  bool present = false;          // false: an unrotated pack (no prism.hadamard keys at all)
  uint32_t version = 1;
  uint32_t block_size = 0;       // n: a non-zero power of two
  std::string transform;         // "normalized-sylvester-walsh-hadamard"
  std::string axis;              // "input-last-dimension"
  std::string sign_mode;         // "identity" | "explicit"
  std::vector<std::string> weight_names;          // folded matrices
  std::vector<std::string> inverse_weight_names;  // the token embedding only
  std::vector<int64_t> sign_widths;               // explicit mode
  std::map<int64_t, std::vector<int8_t>> signs;   // width -> [width] of +-1 (explicit mode)
  bool has_gdn_v_grouped = false;
  bool gdn_v_grouped = false;

  // Sign vector for a K-wide activation; nullptr in identity mode. Throws when explicit and missing.
  const int8_t* signs_for(int64_t K, const std::string& what) const;
};

inline constexpr const char* kHadamardTransform = "normalized-sylvester-walsh-hadamard";
inline constexpr const char* kHadamardAxis = "input-last-dimension";

// Parse and check the rules that need no tensor knowledge. Every problem is appended to `problems`
// (messages name the key); the returned contract is filled as far as the keys allow.
HadamardContract hadamard_from_gguf(const GgufFile& f, std::vector<std::string>& problems);
HadamardContract hadamard_from_json(const nlohmann::json& j, const std::string& source, std::vector<std::string>& problems);

void hadamard_to_gguf(const HadamardContract& h, GgufWriter& w);
nlohmann::json hadamard_to_json(const HadamardContract& h);

}  // namespace bonsai
