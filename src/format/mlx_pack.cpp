#include "format/mlx_pack.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace bonsai {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

bool MlxPack::is_ignored_tensor(const std::string& n) {
  for (const char* p : {"vision_tower.", "model.visual.", "visual.", "mtp.", "model.mtp.", "language_model.mtp.",
                        "language_model.model.mtp."})
    if (n.rfind(p, 0) == 0) return true;
  return false;
}

MlxPack::MlxPack(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) fail("{}: not a directory (an MLX pack is a folder with config.json)", dir);
  if (!has_file("config.json")) fail("{}: config.json is missing (not an MLX pack folder)", dir);
  config_ = read_json_file(file("config.json"));
  if (!config_.is_object()) fail("{}: expected a JSON object", file("config.json"));
  if (has_file("hadamard.json")) hadamard_ = read_json_file(file("hadamard.json"));
  std::vector<std::string> shard_names;
  if (has_file("model.safetensors.index.json")) {
    const auto idx = read_json_file(file("model.safetensors.index.json"));
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("{}: 'weight_map' is missing or not an object", file("model.safetensors.index.json"));
    for (const auto& [name, shard] : idx["weight_map"].items()) {
      if (!shard.is_string()) fail("{}: weight_map['{}'] is not a string", file("model.safetensors.index.json"), name);
      const std::string s = shard.get<std::string>();
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        fail("{}: weight_map['{}'] = '{}' points outside the folder", file("model.safetensors.index.json"), name, s);
      if (std::find(shard_names.begin(), shard_names.end(), s) == shard_names.end()) shard_names.push_back(s);
    }
  } else if (has_file("model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    fail("{}: neither model.safetensors nor model.safetensors.index.json is present", dir);
  }
  for (const auto& s : shard_names) {
    shards_.push_back(std::make_unique<SafetensorsFile>(file(s)));
    file_bytes_ += fs::file_size(file(s));
    for (const StTensor& t : shards_.back()->tensors()) {
      if (is_ignored_tensor(t.name)) continue;
      if (!index_.emplace(t.name, &t).second) fail("{}: tensor '{}' appears in more than one shard", dir, t.name);
      tensors_.push_back(&t);
    }
  }
}

const nlohmann::json& MlxPack::text_config() const {
  if (config_.contains("text_config") && config_["text_config"].is_object()) return config_["text_config"];
  return config_;
}

bool MlxPack::has_file(const std::string& name) const { return fs::is_regular_file(file(name)); }

const StTensor* MlxPack::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> MlxPack::shard_paths() const {
  std::vector<std::string> v;
  for (const auto& s : shards_) v.push_back(s->path());
  return v;
}

}  // namespace bonsai
