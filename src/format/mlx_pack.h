// The MLX 2-bit pack folder: config.json (top-level model_type, text_config, quantization),
// hadamard.json (the prism.hadamard contract), model.safetensors (or shards listed in
// model.safetensors.index.json), tokenizer.json / tokenizer_config.json / chat_template.jinja.
// Tensors of the vision tower and the MTP head are skipped: the text decoder never reads them.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/safetensors.h"

namespace bonsai {

class MlxPack {
 public:
  explicit MlxPack(const std::string& dir);  // throws Error naming the folder / file

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  // text_config when present (the real pack nests it), else the whole config.
  const nlohmann::json& text_config() const;
  const std::optional<nlohmann::json>& hadamard() const { return hadamard_; }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  bool has_file(const std::string& name) const;

  // Text-decoder tensors of every shard (vision / mtp skipped), in file order.
  const std::vector<const StTensor*>& tensors() const { return tensors_; }
  const StTensor* find(const std::string& name) const;
  uint64_t file_bytes() const { return file_bytes_; }  // all shard files
  std::vector<std::string> shard_paths() const;

  static bool is_ignored_tensor(const std::string& name);  // vision tower, mtp

 private:
  std::string dir_;
  nlohmann::json config_;
  std::optional<nlohmann::json> hadamard_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<const StTensor*> tensors_;
  std::map<std::string, const StTensor*> index_;
  uint64_t file_bytes_ = 0;
};

nlohmann::json read_json_file(const std::string& path);  // throws Error naming the file and the parse error

}  // namespace bonsai
