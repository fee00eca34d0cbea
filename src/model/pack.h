// Opening a pack (GGUF file or MLX folder), checking it against the contract, and loading it into the
// canonical Model. Checking collects every problem (for `bonsai inspect`); loading refuses a pack with
// any problem, listing them all.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/mlx_pack.h"
#include "model/config.h"
#include "model/hadamard_contract.h"
#include "model/tensor_names.h"
#include "model/weights.h"

namespace bonsai {

enum class PackFormat { Gguf, Mlx };

struct Pack {
  std::string path;
  PackFormat format = PackFormat::Gguf;
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<MlxPack> mlx;
  uint64_t file_bytes = 0;
  std::string format_name() const;  // "GGUF v3" / "MLX folder"
};

// A directory opens as an MLX folder, a file as GGUF. Throws Error naming the path.
Pack open_pack(const std::string& path);

// Where one canonical tensor comes from.
struct TensorSource {
  const TensorSpec* spec = nullptr;
  std::string file_name;          // name in the file (GGUF name, or MLX base name without .weight)
  uint32_t ggml_type = 0;         // GGUF: the tensor type
  const uint8_t* data = nullptr;  // GGUF data / MLX `.weight`
  uint64_t nbytes = 0;
  const StTensor* mlx_scales = nullptr;
  const StTensor* mlx_biases = nullptr;
  StDtype mlx_dtype = StDtype::F32;  // MLX non-ternary tensors
  bool folded = false;
  bool inverse = false;
};

struct PackCheck {
  bool config_ok = false;
  ModelConfig config;
  HadamardContract contract;
  std::vector<TensorSpec> specs;
  std::vector<TensorSource> sources;   // one per spec found
  std::vector<std::string> problems;   // each names the key / tensor and what was expected
  std::vector<std::string> warnings;   // e.g. tensors the decoder does not use
  bool gdn_tiled_in_file = false;      // GGUF: V heads in tiled order
  bool valid() const { return config_ok && problems.empty(); }
};

PackCheck check_pack(const Pack& pack);

struct LoadOptions {
  int threads = 0;          // 0: all hardware threads
  bool progress = false;    // progress bar on stderr
  bool release_pages = true;  // drop the mapped pages of each tensor that is copied, not viewed (keeps RSS ~ one copy)
};

// Throws Error listing every problem when check_pack finds any.
Model load_model(const Pack& pack, const LoadOptions& opt = {});
Model load_model(const std::string& path, const LoadOptions& opt = {});

// Byte-level equality of two canonical models; on mismatch `diff` names the first differing buffer.
bool canonical_equal(const Model& a, const Model& b, std::string* diff);

// A = -exp(A_log) in fp32: the expression GGUF's ssm_a is written with and the MLX A_log is read with.
inline float a_from_a_log(float a_log) { return -std::exp(a_log); }

// Grouped index k*rep + r <-> tiled index r*Nk + k of GDN V heads (rep = Nv / Nk).
inline int64_t gdn_tiled_to_grouped(int64_t t, int64_t n_k, int64_t n_v) {
  const int64_t rep = n_v / n_k, r = t / n_k, k = t % n_k;
  return k * rep + r;
}
inline int64_t gdn_grouped_to_tiled(int64_t g, int64_t n_k, int64_t n_v) {
  const int64_t rep = n_v / n_k, k = g / rep, r = g % rep;
  return r * n_k + k;
}

}  // namespace bonsai
