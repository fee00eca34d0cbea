#include "pack/make_pack.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "format/gguf.h"
#include "format/ternary_codec.h"
#include "model/hadamard_contract.h"
#include "model/pack.h"
#include "model/tensor_names.h"
#include "pack/float_model.h"
#include "pack/pack_writer.h"
#include "pack/presets.h"
#include "pack/rng.h"
#include "tokenizer/bpe_trainer.h"
#include "util/error.h"
#include "util/half.h"
#include "util/progress.h"

namespace bonsai {

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kAllFormats{"gguf-pq2_0", "gguf-ptq1_0", "mlx", "effective"};

// --- the 27b preset: real shapes and types, random codes and scales, streamed to disk -------------

// All 81 bytes holding four codes in {0, 1, 2} (2 bits each): a uniform draw of one is four uniform codes.
struct CodeBytes {
  uint8_t b[81];
  CodeBytes() {
    int i = 0;
    for (int a = 0; a < 3; ++a)
      for (int c = 0; c < 3; ++c)
        for (int d = 0; d < 3; ++d)
          for (int e = 0; e < 3; ++e) b[i++] = uint8_t(a | c << 2 | d << 4 | e << 6);
  }
};

void fill_random_ternary(uint8_t* dst, uint64_t blocks, TernaryFormat fmt, uint64_t seed) {
  static const CodeBytes table;
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const uint64_t per = (blocks + uint64_t(threads) - 1) / uint64_t(threads);
  const uint64_t bsz = fmt == TernaryFormat::PQ2_0 ? kPq2Bytes : kPtq1Bytes;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Rng rng(Rng::mix(seed, uint64_t(t)));
      const uint64_t b0 = uint64_t(t) * per, b1 = std::min(blocks, b0 + per);
      uint8_t qs[32];
      uint32_t words[8];
      for (uint64_t b = b0; b < b1; ++b) {
        for (int i = 0; i < 32; i += 4) {
          uint64_t r = rng.next();
          for (int j = 0; j < 4; ++j, r >>= 16) qs[i + j] = table.b[((r & 0xffff) * 81) >> 16];
        }
        const uint16_t d = f32_to_fp16(float(0.004 + 0.022 * double(rng.next() >> 11) * (1.0 / 9007199254740992.0)));
        std::memcpy(words, qs, 32);
        if (fmt == TernaryFormat::PQ2_0) pq2_encode_block(words, d, dst + b * bsz);
        else ptq1_encode_block(words, d, dst + b * bsz);
      }
    });
  }
  for (auto& th : pool) th.join();
}

std::string write_random_gguf(const PackPreset& p, const MakePackOptions& opt, TernaryFormat fmt, const std::string& path) {
  const ModelConfig& c = p.config;
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("qwen35"));
  w.set("general.name", GgufValue::str("bonsai-" + p.name + "-random"));
  w.set("general.file_type", GgufValue::u32(fmt == TernaryFormat::PQ2_0 ? 141 : 142));
  config_to_gguf(c, w);
  const auto specs = tensor_specs(c);
  if (opt.hadamard) {
    HadamardContract h = contract_for_rotation(draw_rotation(c, p.hadamard_block, opt.seed));
    for (const TensorSpec& s : specs)
      if (s.kind == TensorKind::Ternary && s.role != Role::TokenEmbd) h.weight_names.push_back(s.gguf_name);
    h.inverse_weight_names = {"token_embd.weight"};
    hadamard_to_gguf(h, w);
  }
  const uint32_t ttype = fmt == TernaryFormat::PQ2_0 ? ggml_type::PQ2_0 : ggml_type::PTQ1_0;
  uint64_t stream = 0;
  for (const TensorSpec& s : specs) {
    const uint64_t seed = Rng::mix(opt.seed, ++stream);
    const uint64_t n = uint64_t(s.rows() * s.cols());
    switch (s.kind) {
      case TensorKind::Ternary:
        w.add_tensor(s.gguf_name, ttype, s.ne, [=](uint8_t* dst, uint64_t) { fill_random_ternary(dst, n / 128, fmt, seed); });
        break;
      case TensorKind::Dense:
        w.add_tensor(s.gguf_name, ggml_type::BF16, s.ne, [=](uint8_t* dst, uint64_t) {
          Rng r(seed);
          for (uint64_t i = 0; i < n; ++i) {
            const uint16_t h = f32_to_bf16(float(r.normal() * 0.014));
            std::memcpy(dst + 2 * i, &h, 2);
          }
        });
        break;
      default: {
        const Role role = s.role;
        w.add_tensor(s.gguf_name, ggml_type::F32, s.ne, [=](uint8_t* dst, uint64_t) {
          Rng r(seed);
          for (uint64_t i = 0; i < n; ++i) {
            float v;
            if (role == Role::GdnA) v = -float(r.uniform(1.0, 16.0));          // ssm_a = -exp(A_log)
            else if (role == Role::GdnConv) v = float(r.uniform(-0.5, 0.5));
            else if (role == Role::GdnDtBias) v = float(r.uniform(-1.0, 1.0));
            else v = float(r.uniform(0.6, 1.4));                                // norm gains
            std::memcpy(dst + 4 * i, &v, 4);
          }
        });
      }
    }
  }
  Progress progress("writing " + path, w.total_bytes(), opt.progress);
  w.write(path, opt.progress ? &progress : nullptr);
  progress.finish();
  return path;
}

}  // namespace

std::string pack_output_name(const MakePackOptions& opt, const std::string& format) {
  const std::string stem = opt.preset + (opt.hadamard ? "" : "-nohad");
  if (format == "gguf-pq2_0") return stem + "-pq2_0.gguf";
  if (format == "gguf-ptq1_0") return stem + "-ptq1_0.gguf";
  if (format == "mlx") return stem + "-mlx";
  if (format == "effective") return stem + "-effective";
  fail("unknown pack format '{}': known formats are gguf-pq2_0, gguf-ptq1_0, mlx, effective", format);
}

MakePackResult make_pack(const MakePackOptions& opt) {
  PackPreset p = pack_preset(opt.preset);
  std::vector<std::string> formats = opt.formats;
  if (formats.empty()) formats = p.float_model ? kAllFormats : std::vector<std::string>{"gguf-pq2_0"};
  for (const auto& f : formats) (void)pack_output_name(opt, f);  // validates the names
  fs::create_directories(opt.out_dir);
  MakePackResult res;
  auto out = [&](const std::string& f) { return (fs::path(opt.out_dir) / pack_output_name(opt, f)).string(); };

  if (!p.float_model) {
    for (const auto& f : formats) {
      if (f != "gguf-pq2_0" && f != "gguf-ptq1_0")
        fail("preset '{}' draws random codes without a float model and writes GGUF only (gguf-pq2_0, gguf-ptq1_0), not '{}'", p.name, f);
      res.paths.push_back(write_random_gguf(p, opt, f == "gguf-pq2_0" ? TernaryFormat::PQ2_0 : TernaryFormat::PTQ1_0, out(f)));
    }
    return res;
  }

  const Vocabulary vocab = tiny_vocabulary();
  p.config.vocab = int64_t(vocab.size());
  const FloatModel fm = draw_float_model(p.config, opt.seed);
  HadamardRotation rot;
  if (opt.hadamard) rot = draw_rotation(p.config, p.hadamard_block, opt.seed);
  const Model m = fold_and_ternarise(fm, rot);
  PackExtras x;
  x.name = "bonsai-" + p.name;
  x.vocab = &vocab;
  x.chat_template = qwen35_chat_template();
  x.progress = opt.progress;
  for (int64_t i = 0; i < p.config.n_layers; ++i)
    if (!p.config.full_attention[size_t(i)]) x.a_log[i] = fm.tensors.at(fmt::format("model.layers.{}.linear_attn.A_log", i));
  for (const auto& f : formats) {
    const std::string path = out(f);
    if (f == "gguf-pq2_0") write_gguf_pack(m, x, TernaryFormat::PQ2_0, path);
    else if (f == "gguf-ptq1_0") write_gguf_pack(m, x, TernaryFormat::PTQ1_0, path);
    else if (f == "mlx") write_mlx_pack(m, x, path);
    else write_effective_weights(effective_float_model(m, x.a_log), x, path);
    res.paths.push_back(path);
  }
  return res;
}

}  // namespace bonsai
