// The Hadamard contract survives both containers, and the tensor inventory matches the real file.
#include <gtest/gtest.h>

#include "format/gguf.h"
#include "model/hadamard_contract.h"
#include "model/tensor_names.h"
#include "pack/float_model.h"
#include "pack/pack_writer.h"
#include "pack/presets.h"
#include "tiny_packs.h"

using namespace bonsai;

namespace {
const int8_t kReal5120[16] = {-1, -1, -1, +1, -1, +1, +1, +1, +1, +1, +1, +1, -1, -1, -1, -1};  // FACTS section 2
}

TEST(Contract, RealFirstSignsSurviveGgufAndJsonRoundTrips) {
  const PackPreset p = pack_preset("27b");
  HadamardContract h = contract_for_rotation(draw_rotation(p.config, 1024, 3));
  h.weight_names = {"blk.0.ffn_up.weight"};
  h.inverse_weight_names = {"token_embd.weight"};
  ASSERT_EQ(h.sign_widths, (std::vector<int64_t>{5120, 6144, 17408}));
  // GGUF.
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("qwen35"));
  hadamard_to_gguf(h, w);
  const std::string path = ::testing::TempDir() + "/contract_signs.gguf";
  w.write(path);
  GgufFile g(path);
  EXPECT_EQ(g.find("prism.hadamard.sign_values")->elem_type, GgufType::INT32);
  std::vector<std::string> problems;
  const HadamardContract back = hadamard_from_gguf(g, problems);
  EXPECT_TRUE(problems.empty()) << problems.front();
  // hadamard.json (sign values as floats +-1.0).
  const nlohmann::json j = nlohmann::json::parse(hadamard_to_json(h).dump());
  EXPECT_TRUE(j["sign_values"][0].is_number_float());
  const HadamardContract back_json = hadamard_from_json(j, "hadamard.json", problems);
  EXPECT_TRUE(problems.empty());
  for (const HadamardContract* c : {&back, &back_json}) {
    const auto& s = c->signs.at(5120);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(s[size_t(i)], kReal5120[i]) << i;
    EXPECT_EQ(c->signs, h.signs);
    EXPECT_EQ(c->block_size, 1024u);
    EXPECT_TRUE(c->gdn_v_grouped);
  }
}

TEST(Contract, JsonRulesAreCheckedToo) {
  nlohmann::json j = hadamard_to_json(contract_for_rotation(draw_rotation(pack_preset("tiny").config, 1024, 1)));
  j["weight_names"] = {"blk.0.ffn_up.weight"};
  j["sign_values"][3] = 0.5;
  std::vector<std::string> problems;
  hadamard_from_json(j, "x/hadamard.json", problems);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("x/hadamard.json: sign_values[3] is 0.5, expected +1 or -1"), std::string::npos) << problems[0];
}

TEST(Contract, InventoryOfThe27bMatchesTheRealFile) {
  const PackPreset p = pack_preset("27b");
  const auto specs = tensor_specs(p.config);
  EXPECT_EQ(specs.size(), 851u);  // FACTS section 2: 851 tensors
  int ternary = 0;
  for (const auto& s : specs) ternary += s.kind == TensorKind::Ternary;
  EXPECT_EQ(ternary, 402);  // 401 folded + the embedding
  EXPECT_EQ(p.config.n_full_attention(), 16);
  EXPECT_TRUE(p.config.full_attention[3] && p.config.full_attention[63] && !p.config.full_attention[0]);
  auto has = [&](const std::string& n, std::vector<uint64_t> ne) {
    const TensorSpec* s = find_spec(specs, n);
    return s && s->gguf_name == n && s->ne == ne;
  };
  EXPECT_TRUE(has("token_embd.weight", {5120, 248320}));
  EXPECT_TRUE(has("blk.0.attn_qkv.weight", {5120, 10240}));
  EXPECT_TRUE(has("blk.0.attn_gate.weight", {5120, 6144}));
  EXPECT_TRUE(has("blk.0.ssm_out.weight", {6144, 5120}));
  EXPECT_TRUE(has("blk.0.ssm_alpha.weight", {5120, 48}));
  EXPECT_TRUE(has("blk.0.ssm_conv1d.weight", {4, 10240}));
  EXPECT_TRUE(has("blk.0.ssm_a", {48}));
  EXPECT_TRUE(has("blk.0.ssm_dt.bias", {48}));
  EXPECT_TRUE(has("blk.3.attn_q.weight", {5120, 12288}));
  EXPECT_TRUE(has("blk.3.attn_k.weight", {5120, 1024}));
  EXPECT_TRUE(has("blk.3.attn_output.weight", {6144, 5120}));
  EXPECT_TRUE(has("blk.63.ffn_down.weight", {17408, 5120}));
  // HF / MLX names map to the same tensors.
  EXPECT_EQ(find_spec(specs, "language_model.model.layers.0.linear_attn.in_proj_qkv.weight")->gguf_name, "blk.0.attn_qkv.weight");
  EXPECT_EQ(find_spec(specs, "model.language_model.layers.5.mlp.down_proj.weight")->gguf_name, "blk.5.ffn_down.weight");
  EXPECT_EQ(find_spec(specs, "language_model.lm_head")->gguf_name, "output.weight");
}
