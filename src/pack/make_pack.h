// `bonsai make-pack`: writes packs exactly as the real converter does, from a preset and a seed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace bonsai {

struct MakePackOptions {
  std::string preset = "tiny";
  uint64_t seed = 1;
  // Any of: gguf-pq2_0, gguf-ptq1_0, mlx, effective. Empty: all the preset supports.
  std::vector<std::string> formats;
  std::string out_dir = "packs";
  bool hadamard = true;     // false: --no-hadamard, an unrotated pack of the same float model
  bool progress = false;
};

struct MakePackResult {
  std::vector<std::string> paths;  // what was written, one per format
};

MakePackResult make_pack(const MakePackOptions& opt);

// File / folder name make-pack gives a format: "<preset>[-nohad]-pq2_0.gguf", "-mlx", "-effective".
std::string pack_output_name(const MakePackOptions& opt, const std::string& format);

const std::string& qwen35_chat_template();

}  // namespace bonsai
