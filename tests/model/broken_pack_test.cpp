// Table-driven: broken variants of a good tiny pack, each refused with its own message naming the key
// or tensor and what was expected. Variants are made by rewriting the good GGUF through our writer with
// one change, or by patching its bytes (for faults our writer cannot produce).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "format/gguf.h"
#include "format/mlx_pack.h"
#include "format/safetensors.h"
#include "model/pack.h"
#include "tiny_packs.h"
#include "util/error.h"

using namespace bonsai;
using bonsai::testing_support::tiny_packs;

namespace {

struct Tensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;
  std::vector<uint8_t> bytes;
};
using Keys = std::vector<std::pair<std::string, GgufValue>>;

// Rewrites the good PQ2_0 pack with `edit` applied to its keys and tensors.
std::string rewrite(const std::string& name, const std::function<void(Keys&, std::vector<Tensor>&)>& edit) {
  GgufFile g(tiny_packs().pq2);
  Keys keys;
  for (const auto& k : g.keys())
    if (k != "general.alignment") keys.emplace_back(k, *g.find(k));
  std::vector<Tensor> tensors;
  for (const auto& t : g.tensors()) tensors.push_back({t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  edit(keys, tensors);
  GgufWriter w;
  for (auto& [k, v] : keys) w.set(k, v);
  for (auto& t : tensors) w.add_tensor(t.name, t.type, t.ne, std::move(t.bytes));
  const std::string path = tiny_packs().dir + "/broken_" + name + ".gguf";
  w.write(path);
  return path;
}

GgufValue& key(Keys& keys, const std::string& k) {
  for (auto& [name, v] : keys)
    if (name == k) return v;
  throw std::runtime_error("test: no key " + k);
}
void drop_key(Keys& keys, const std::string& k) {
  std::erase_if(keys, [&](const auto& kv) { return kv.first == k; });
}
Tensor& tensor(std::vector<Tensor>& ts, const std::string& n) {
  for (auto& t : ts)
    if (t.name == n) return t;
  throw std::runtime_error("test: no tensor " + n);
}

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
std::string write_bytes(const std::string& name, const std::vector<uint8_t>& b) {
  const std::string path = tiny_packs().dir + "/broken_" + name + ".gguf";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  return path;
}
// Byte offset just after the last occurrence of a GGUF string (u64 length + bytes) equal to s.
size_t after_string(const std::vector<uint8_t>& b, const std::string& s) {
  std::vector<uint8_t> pat(8 + s.size());
  const uint64_t n = s.size();
  std::memcpy(pat.data(), &n, 8);
  std::memcpy(pat.data() + 8, s.data(), s.size());
  auto it = std::find_end(b.begin(), b.end(), pat.begin(), pat.end());  // tensor infos follow the metadata
  if (it == b.end()) throw std::runtime_error("test: string not found " + s);
  return size_t(it - b.begin()) + pat.size();
}

// Every problem the pack gets, from opening or checking it, joined.
std::string problems_of(const std::string& path) {
  try {
    const Pack p = open_pack(path);
    const PackCheck c = check_pack(p);
    std::string all;
    for (const auto& s : c.problems) all += s + "\n";
    if (all.empty()) {
      // A pack whose problem only shows while copying (e.g. ssm_a values) must fail to load.
      try {
        load_model(p);
      } catch (const Error& e) {
        return std::string("load: ") + e.what();
      }
    }
    return all;
  } catch (const Error& e) {
    return std::string("open: ") + e.what();
  }
}

struct Case {
  const char* name;
  std::function<std::string()> make;  // returns the path of the broken pack
  const char* expect;                 // substring of the message
};

const std::string P = "prism.hadamard.";

std::vector<Case> cases() {
  return {
      {"wrong_version", [] { return rewrite("wrong_version", [](Keys& k, auto&) { key(k, P + "version") = GgufValue::u32(2); }); },
       "prism.hadamard.version is 2, expected 1"},
      {"unknown_transform",
       [] { return rewrite("unknown_transform", [](Keys& k, auto&) { key(k, P + "transform") = GgufValue::str("dct"); }); },
       "prism.hadamard.transform is 'dct', expected 'normalized-sylvester-walsh-hadamard'"},
      {"unknown_axis",
       [] { return rewrite("unknown_axis", [](Keys& k, auto&) { key(k, P + "axis") = GgufValue::str("output-first-dimension"); }); },
       "prism.hadamard.axis is 'output-first-dimension', expected 'input-last-dimension'"},
      {"unknown_sign_mode",
       [] { return rewrite("unknown_sign_mode", [](Keys& k, auto&) { key(k, P + "sign_mode") = GgufValue::str("random"); }); },
       "prism.hadamard.sign_mode is 'random', expected 'identity' or 'explicit'"},
      {"block_not_pow2",
       [] { return rewrite("block_not_pow2", [](Keys& k, auto&) { key(k, P + "block_size") = GgufValue::u32(1000); }); },
       "prism.hadamard.block_size is 1000, expected a non-zero power of two"},
      {"width_not_multiple",
       [] {
         return rewrite("width_not_multiple", [](Keys& k, auto&) {
           auto& w = key(k, P + "sign_widths");
           w.arr[1].i = 3000;  // was 3072: values length then also mismatches
         });
       },
       "prism.hadamard.sign_widths has 3000, expected a positive multiple of block_size 1024"},
      {"missing_sign_vector",
       [] {
         return rewrite("missing_sign_vector", [](Keys& k, auto&) {
           // Drop the last width (the FFN's 2048) and its values.
           auto& w = key(k, P + "sign_widths");
           const int64_t last = w.arr.back().i;
           w.arr.pop_back();
           auto& v = key(k, P + "sign_values");
           v.arr.resize(v.arr.size() - size_t(last));
         });
       },
       "'blk.0.ffn_down.weight' has K = 2048 but prism.hadamard.sign_widths has no vector of that width"},
      {"sign_value_zero",
       [] { return rewrite("sign_value_zero", [](Keys& k, auto&) { key(k, P + "sign_values").arr[5].i = 0; }); },
       "prism.hadamard.sign_values[5] is 0, expected +1 or -1"},
      {"sign_value_two",
       [] { return rewrite("sign_value_two", [](Keys& k, auto&) { key(k, P + "sign_values").arr[1030].i = 2; }); },
       "prism.hadamard.sign_values[1030] is 2, expected +1 or -1"},
      {"sign_values_length",
       [] { return rewrite("sign_values_length", [](Keys& k, auto&) { key(k, P + "sign_values").arr.pop_back(); }); },
       "prism.hadamard.sign_values has 6143 entries, expected 6144 (the sum of sign_widths)"},
      {"duplicated_weight_name",
       [] {
         return rewrite("duplicated_weight_name", [](Keys& k, auto&) {
           auto& w = key(k, P + "weight_names");
           w.arr.push_back(w.arr[0]);
         });
       },
       "prism.hadamard.weight_names lists 'blk.0.attn_qkv.weight' twice"},
      {"unknown_weight_name",
       [] {
         return rewrite("unknown_weight_name", [](Keys& k, auto&) {
           key(k, P + "weight_names").arr.push_back(GgufValue::str("blk.99.ffn_up.weight"));
         });
       },
       "prism.hadamard.weight_names lists 'blk.99.ffn_up.weight', which is not a tensor of this model"},
      {"folded_not_ternary",
       [] {
         return rewrite("folded_not_ternary", [](Keys& k, auto&) {
           key(k, P + "weight_names").arr.push_back(GgufValue::str("blk.0.attn_norm.weight"));
         });
       },
       "lists 'blk.0.attn_norm.weight', which is not a ternary matrix"},
      {"inverse_not_embedding",
       [] {
         return rewrite("inverse_not_embedding", [](Keys& k, auto&) {
           key(k, P + "inverse_weight_names") = GgufValue::arr_str({"output.weight"});
         });
       },
       "prism.hadamard.inverse_weight_names lists 'output.weight', expected only the token embedding"},
      {"missing_tensor",
       [] {
         return rewrite("missing_tensor", [](auto&, std::vector<Tensor>& t) {
           std::erase_if(t, [](const Tensor& x) { return x.name == "blk.1.ffn_up.weight"; });
         });
       },
       "tensor 'blk.1.ffn_up.weight' is missing"},
      {"wrong_shape",
       [] {
         return rewrite("wrong_shape", [](auto&, std::vector<Tensor>& t) {
           auto& x = tensor(t, "blk.2.ssm_norm.weight");  // [128] -> [64]
           x.ne = {64};
           x.bytes.resize(64 * 4);
         });
       },
       "tensor 'blk.2.ssm_norm.weight' has shape [64], expected [128]"},
      {"wrong_type",
       [] {
         return rewrite("wrong_type", [](auto&, std::vector<Tensor>& t) {
           auto& x = tensor(t, "blk.0.attn_norm.weight");
           x.type = ggml_type::F16;
           x.bytes.resize(x.bytes.size() / 2);
         });
       },
       "tensor 'blk.0.attn_norm.weight' has type F16, expected F32"},
      {"ternary_as_f32",
       [] {
         return rewrite("ternary_as_f32", [](auto&, std::vector<Tensor>& t) {
           auto& x = tensor(t, "blk.3.attn_k.weight");
           x.type = ggml_type::F32;
           x.bytes.assign(x.ne[0] * x.ne[1] * 4, 0);
         });
       },
       "tensor 'blk.3.attn_k.weight' has type F32, expected PQ2_0 or PTQ1_0"},
      {"missing_config_key",
       [] { return rewrite("missing_config_key", [](Keys& k, auto&) { drop_key(k, "qwen35.ssm.group_count"); }); },
       "qwen35.ssm.group_count"},
      {"wrong_architecture",
       [] { return rewrite("wrong_architecture", [](Keys& k, auto&) { key(k, "general.architecture") = GgufValue::str("llama"); }); },
       "general.architecture is 'llama', expected 'qwen35'"},
      {"positive_ssm_a",
       [] {
         return rewrite("positive_ssm_a", [](auto&, std::vector<Tensor>& t) {
           const float one = 1.0f;
           std::memcpy(tensor(t, "blk.1.ssm_a").bytes.data(), &one, 4);
         });
       },
       "expected a negative finite decay rate"},
      {"truncated_data",
       [] {
         auto b = read_all(tiny_packs().pq2);
         b.resize(b.size() - 1000);
         return write_bytes("truncated_data", b);
       },
       "output.weight"},
      {"misaligned_offset",
       [] {
         auto b = read_all(tiny_packs().pq2);
         size_t at = after_string(b, "blk.0.attn_qkv.weight");
         uint32_t n_dims;
         std::memcpy(&n_dims, &b[at], 4);
         at += 4 + 8 * n_dims + 4;  // n_dims, ne[], type -> offset
         uint64_t off;
         std::memcpy(&off, &b[at], 8);
         off += 1;
         std::memcpy(&b[at], &off, 8);
         return write_bytes("misaligned_offset", b);
       },
       "blk.0.attn_qkv.weight"},
      {"absurd_tensor_count",
       [] {
         auto b = read_all(tiny_packs().pq2);
         const uint64_t n = 1ull << 60;
         std::memcpy(&b[8], &n, 8);
         return write_bytes("absurd_tensor_count", b);
       },
       "tensor"},
      {"absurd_string_count",
       [] {
         auto b = read_all(tiny_packs().pq2);
         const size_t at = after_string(b, "tokenizer.ggml.tokens") + 4 + 4;  // value type ARRAY, element type STRING
         const uint64_t n = 1ull << 60;
         std::memcpy(&b[at], &n, 8);
         return write_bytes("absurd_string_count", b);
       },
       "tokenizer.ggml.tokens"},
      {"wrong_gguf_version",
       [] {
         auto b = read_all(tiny_packs().pq2);
         const uint32_t v = 7;
         std::memcpy(&b[4], &v, 4);
         return write_bytes("wrong_gguf_version", b);
       },
       "version"},
  };
}

}  // namespace

TEST(BrokenPacks, GoodPackIsValid) {
  const PackCheck c = check_pack(open_pack(tiny_packs().pq2));
  EXPECT_TRUE(c.valid());
  for (const auto& p : c.problems) ADD_FAILURE() << p;
}

TEST(BrokenPacks, EachIsRefusedWithItsOwnMessage) {
  std::set<std::string> messages;
  int n = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const std::string path = c.make();
    const std::string msg = problems_of(path);
    EXPECT_FALSE(msg.empty()) << c.name << " was accepted";
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": expected '" << c.expect << "' in:\n" << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": the message does not name the file:\n" << msg;
    EXPECT_TRUE(messages.insert(msg).second) << c.name << " has the same message as another case";
    ++n;
  }
  EXPECT_GE(n, 15);
}

TEST(BrokenPacks, LoadRefusesListingEveryProblem) {
  const std::string path = rewrite("two_problems", [](Keys& k, auto&) {
    key(k, P + "version") = GgufValue::u32(3);
    key(k, P + "axis") = GgufValue::str("rows");
  });
  try {
    load_model(path);
    FAIL() << "loaded a broken pack";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("2 problems"), std::string::npos) << m;
    EXPECT_NE(m.find("version is 3"), std::string::npos) << m;
    EXPECT_NE(m.find("axis is 'rows'"), std::string::npos) << m;
  }
}

namespace {

// Copies the good MLX folder, then rewrites model.safetensors with `edit` applied to one tensor's bytes
// and/or replaces hadamard.json.
std::string broken_mlx(const std::string& name, const std::string& tensor, const std::function<void(std::vector<uint8_t>&)>& edit,
                       const std::function<void(nlohmann::json&)>& edit_contract = nullptr) {
  namespace fs = std::filesystem;
  const std::string dir = tiny_packs().dir + "/broken_" + name + "-mlx";
  fs::remove_all(dir);
  fs::copy(tiny_packs().mlx, dir, fs::copy_options::recursive);
  if (!tensor.empty()) {
    SafetensorsWriter w;
    {
      SafetensorsFile f(tiny_packs().mlx + "/model.safetensors");
      for (const StTensor& t : f.tensors()) {
        std::vector<uint8_t> b(t.data, t.data + t.nbytes);
        if (t.name == tensor) edit(b);
        w.add(t.name, t.dtype, t.shape, std::move(b));
      }
    }
    w.write(dir + "/model.safetensors");
  }
  if (edit_contract) {
    nlohmann::json j = read_json_file(dir + "/hadamard.json");
    edit_contract(j);
    std::ofstream(dir + "/hadamard.json") << j.dump();
  }
  return dir;
}

}  // namespace

TEST(BrokenPacks, MlxBiasesMustBeMinusScales) {
  const std::string dir = broken_mlx("biases", "language_model.model.layers.1.mlp.up_proj.biases", [](std::vector<uint8_t>& b) {
    b[2 * 77 + 1] ^= 0x80;  // flip the sign of one bias: now equal to +scale
  });
  try {
    load_model(dir);
    FAIL() << "loaded MLX biases that are not -scales";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("up_proj"), std::string::npos) << e.what();
  }
}

TEST(BrokenPacks, MlxContractIsCheckedLikeGguf) {
  const std::string dir = broken_mlx("contract", "", nullptr, [](nlohmann::json& j) {
    j.erase("transform");
    j["inverse_weight_names"] = {"blk.0.ffn_up.weight"};
  });
  const std::string msg = problems_of(dir);
  EXPECT_NE(msg.find("hadamard.json: key 'transform' is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("inverse_weight_names lists 'blk.0.ffn_up.weight'"), std::string::npos) << msg;
}
