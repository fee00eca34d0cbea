// Writes a small seed corpus for the fuzz targets: a few valid GGUF and safetensors files that between
// them use every metadata value type, nested arrays, non-default alignment and every tensor type family.
// Usage: fuzz_seeds <out_dir>   (creates <out_dir>/gguf and <out_dir>/safetensors)
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "util/error.h"

using namespace bonsai;

namespace {

std::vector<uint8_t> bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);  // [n] u8
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 37);
  return v;
}

void gguf_seeds(const std::string& dir) {
  using V = GgufValue;
  {  // every value type, nested arrays, one tensor per family
    GgufWriter w;
    w.set("general.architecture", V::str("qwen35"));
    w.set("u8", V::u8(1));
    w.set("i8", V::i8(-1));
    w.set("u16", V::u16(2));
    w.set("i16", V::i16(-2));
    w.set("u32", V::u32(3));
    w.set("i32", V::i32(-3));
    w.set("f32", V::f32(1e-6f));
    w.set("bool", V::boolean(true));
    w.set("u64", V::u64(4));
    w.set("i64", V::i64(-4));
    w.set("f64", V::f64(0.5));
    w.set("tokens", V::arr_str({"a", "b", "\xc4\xa0"}));
    w.set("types", V::arr_i32({1, 1, 3}));
    w.set("nested", V::array(GgufType::ARRAY, {V::arr_str({"x"}), V::arr_str({})}));
    w.add_tensor("norm.weight", ggml_type::F32, {4}, bytes(16, 1));
    w.add_tensor("w.pq2", ggml_type::PQ2_0, {128, 2}, bytes(68, 2));
    w.add_tensor("w.ptq1", ggml_type::PTQ1_0, {128}, bytes(28, 3));
    w.add_tensor("alpha", ggml_type::BF16, {3, 2}, bytes(12, 4));
    w.write(dir + "/types.gguf");
  }
  {  // non-default alignment, Hadamard-style keys
    GgufWriter w;
    w.set_alignment(64);
    w.set("prism.hadamard.version", V::u32(1));
    w.set("prism.hadamard.block_size", V::u32(128));
    w.set("prism.hadamard.weight_names", V::arr_str({"w"}));
    w.set("prism.hadamard.sign_widths", V::arr_i32({128}));
    w.set("prism.hadamard.gdn_v_grouped", V::boolean(true));
    w.add_tensor("w", ggml_type::PQ2_0, {128, 1}, bytes(34, 5));
    w.add_tensor("q8", ggml_type::Q8_0, {32}, bytes(34, 6));
    w.add_tensor("f16", ggml_type::F16, {2, 2, 2}, bytes(16, 7));
    w.write(dir + "/align64.gguf");
  }
  {  // metadata only
    GgufWriter w;
    w.set("tokenizer.ggml.model", V::str("gpt2"));
    w.set("tokenizer.ggml.merges", V::arr_str({"a b", "ab c"}));
    w.write(dir + "/kv_only.gguf");
  }
}

void safetensors_seeds(const std::string& dir) {
  {
    SafetensorsWriter w;
    w.set_metadata("format", "mlx");
    w.add("language_model.model.layers.0.mlp.gate_proj.weight", StDtype::U32, {2, 8}, bytes(64, 1));
    w.add("language_model.model.layers.0.mlp.gate_proj.scales", StDtype::F16, {2, 1}, bytes(4, 2));
    w.add("language_model.model.layers.0.mlp.gate_proj.biases", StDtype::F16, {2, 1}, bytes(4, 3));
    w.add("a_log", StDtype::F32, {3}, bytes(12, 4));
    w.write(dir + "/mlx.safetensors");
  }
  {
    SafetensorsWriter w;
    const StDtype all[] = {StDtype::BOOL, StDtype::U8,  StDtype::I8,  StDtype::U16, StDtype::I16,
                           StDtype::F16,  StDtype::BF16, StDtype::U32, StDtype::I32, StDtype::F32,
                           StDtype::U64,  StDtype::I64, StDtype::F64};
    int k = 0;
    for (StDtype d : all) {
      w.add(std::string("t_") + st_dtype_name(d), d, {2}, bytes(2 * st_dtype_size(d), uint8_t(k++)));
    }
    w.add("scalar", StDtype::F32, {}, bytes(4, 9));
    w.add("empty", StDtype::F16, {0, 3}, std::vector<uint8_t>{});
    w.write(dir + "/dtypes.safetensors");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out_dir>\n", argv[0]);
    return 2;
  }
  try {
    const std::string out = argv[1];
    std::filesystem::create_directories(out + "/gguf");
    std::filesystem::create_directories(out + "/safetensors");
    gguf_seeds(out + "/gguf");
    safetensors_seeds(out + "/safetensors");
  } catch (const Error& e) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
