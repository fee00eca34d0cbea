// open_pack and check_pack: every structural rule of a pack, collected as problems.
#include <filesystem>
#include <set>

#include "format/ternary_codec.h"
#include "model/pack.h"
#include "util/error.h"

namespace bonsai {

namespace fs = std::filesystem;

std::string Pack::format_name() const { return format == PackFormat::Gguf ? "GGUF" : "MLX folder"; }

Pack open_pack(const std::string& path) {
  Pack p;
  p.path = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    p.format = PackFormat::Mlx;
    p.mlx = std::make_unique<MlxPack>(path);
    p.file_bytes = p.mlx->file_bytes();
  } else {
    if (!fs::exists(path, ec)) fail("{}: no such file or folder", path);
    p.format = PackFormat::Gguf;
    p.gguf = std::make_unique<GgufFile>(path);
    p.file_bytes = p.gguf->file_size();
  }
  return p;
}

namespace {

std::string shape_str(const std::vector<uint64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

bool is_ternary_type(uint32_t t) { return t == ggml_type::PQ2_0 || t == ggml_type::PTQ1_0; }

// GGUF: find each spec's tensor and check its type and shape.
void check_gguf_tensors(const GgufFile& f, PackCheck& pc) {
  std::set<std::string> known;
  for (const TensorSpec& s : pc.specs) {
    known.insert(s.gguf_name);
    const GgufTensorInfo* t = f.find_tensor(s.gguf_name);
    if (!t) {
      if (s.required) pc.problems.push_back(fmt::format("{}: tensor '{}' is missing", f.path(), s.gguf_name));
      continue;
    }
    if (t->ne != s.ne) {
      pc.problems.push_back(fmt::format("{}: tensor '{}' has shape {}, expected {}", f.path(), s.gguf_name,
                                        shape_str(t->ne), shape_str(s.ne)));
      continue;
    }
    bool type_ok = false;
    const char* want = "";
    switch (s.kind) {
      case TensorKind::Ternary: type_ok = is_ternary_type(t->type); want = "PQ2_0 or PTQ1_0"; break;
      case TensorKind::Vector: type_ok = t->type == ggml_type::F32; want = "F32"; break;
      case TensorKind::Conv: type_ok = t->type == ggml_type::F32; want = "F32"; break;
      case TensorKind::Dense:
        type_ok = t->type == ggml_type::BF16 || t->type == ggml_type::F16 || t->type == ggml_type::F32;
        want = "BF16, F16 or F32";
        break;
    }
    if (!type_ok) {
      pc.problems.push_back(fmt::format("{}: tensor '{}' has type {}, expected {}", f.path(), s.gguf_name,
                                        ggml_type_name(t->type), want));
      continue;
    }
    TensorSource src;
    src.spec = &s;
    src.file_name = s.gguf_name;
    src.ggml_type = t->type;
    src.data = t->data;
    src.nbytes = t->nbytes;
    pc.sources.push_back(src);
  }
  for (const auto& t : f.tensors())
    if (!known.count(t.name))
      pc.warnings.push_back(fmt::format("{}: tensor '{}' is not part of the qwen35 decoder and is ignored", f.path(), t.name));
}

// MLX: HF names under a prefix; ternary matrices are base.weight (u32) + base.scales + base.biases (f16).
void check_mlx_tensors(const MlxPack& m, PackCheck& pc) {
  std::string prefix;
  for (const char* p : {"language_model.", "model.language_model.", ""}) {
    if (m.find(std::string(p) + "model.embed_tokens.weight")) { prefix = p; break; }
    if (std::string(p) == "model.language_model." && m.find("model.language_model.embed_tokens.weight")) { prefix = p; break; }
  }
  auto file_name = [&](const TensorSpec& s) {
    if (prefix == "model.language_model.") {
      std::string n = s.hf_name;  // "model.layers.0..." -> "model.language_model.layers.0..."
      if (n.rfind("model.", 0) == 0) return prefix + n.substr(6);
      return n;  // lm_head.weight stays top-level
    }
    return prefix + s.hf_name;
  };
  std::set<std::string> used;
  for (const TensorSpec& s : pc.specs) {
    const std::string name = file_name(s);
    const StTensor* t = m.find(name);
    if (!t) {
      if (s.required) pc.problems.push_back(fmt::format("{}: tensor '{}' is missing", m.dir(), name));
      continue;
    }
    used.insert(name);
    TensorSource src;
    src.spec = &s;
    src.file_name = name;
    src.data = t->data;
    src.nbytes = t->nbytes;
    src.mlx_dtype = t->dtype;
    const int64_t N = s.rows(), K = s.cols();
    auto bad = [&](const std::string& what) { pc.problems.push_back(fmt::format("{}: tensor '{}' {}", m.dir(), name, what)); };
    switch (s.kind) {
      case TensorKind::Ternary: {
        const std::string base = name.substr(0, name.size() - std::string(".weight").size());
        const StTensor* sc = m.find(base + ".scales");
        const StTensor* bi = m.find(base + ".biases");
        used.insert(base + ".scales");
        used.insert(base + ".biases");
        const std::vector<uint64_t> wshape{uint64_t(N), uint64_t(K / 16)}, sshape{uint64_t(N), uint64_t(K / 128)};
        if (t->dtype != StDtype::U32 || t->shape != wshape) {
          bad(fmt::format("is {} {}, expected U32 {} (2-bit words of a [{}, {}] matrix)", st_dtype_name(t->dtype),
                          shape_str(t->shape), shape_str(wshape), N, K));
          continue;
        }
        if (!sc || !bi) {
          bad(fmt::format("has no '{}' tensor, expected F16 {} beside the words", !sc ? base + ".scales" : base + ".biases", shape_str(sshape)));
          continue;
        }
        if (sc->dtype != StDtype::F16 || sc->shape != sshape || bi->dtype != StDtype::F16 || bi->shape != sshape) {
          bad(fmt::format("scales/biases are {} {} / {} {}, expected F16 {}", st_dtype_name(sc->dtype), shape_str(sc->shape),
                          st_dtype_name(bi->dtype), shape_str(bi->shape), shape_str(sshape)));
          continue;
        }
        src.mlx_scales = sc;
        src.mlx_biases = bi;
        break;
      }
      case TensorKind::Vector:
      case TensorKind::Dense: {
        const bool float_type = t->dtype == StDtype::F32 || t->dtype == StDtype::F16 || t->dtype == StDtype::BF16;
        const std::vector<uint64_t> want = s.kind == TensorKind::Vector ? std::vector<uint64_t>{uint64_t(K)}
                                                                        : std::vector<uint64_t>{uint64_t(N), uint64_t(K)};
        if (!float_type || t->shape != want) {
          bad(fmt::format("is {} {}, expected F32/F16/BF16 {}", st_dtype_name(t->dtype), shape_str(t->shape), shape_str(want)));
          continue;
        }
        break;
      }
      case TensorKind::Conv: {
        // The HF layout [C, 1, Kc], MLX's [C, Kc, 1] and a squeezed [C, Kc] hold the same bytes.
        const uint64_t C = uint64_t(N), Kc = uint64_t(K);
        const bool shape_ok = t->shape == std::vector<uint64_t>{C, 1, Kc} || t->shape == std::vector<uint64_t>{C, Kc, 1} ||
                              t->shape == std::vector<uint64_t>{C, Kc};
        const bool float_type = t->dtype == StDtype::F32 || t->dtype == StDtype::F16 || t->dtype == StDtype::BF16;
        if (!shape_ok || !float_type) {
          bad(fmt::format("is {} {}, expected F32/F16/BF16 [{}, 1, {}] (or [{}, {}, 1] or [{}, {}])", st_dtype_name(t->dtype),
                          shape_str(t->shape), C, Kc, C, Kc, C, Kc));
          continue;
        }
        break;
      }
    }
    pc.sources.push_back(src);
  }
  for (const StTensor* t : m.tensors())
    if (!used.count(t->name))
      pc.warnings.push_back(fmt::format("{}: tensor '{}' is not part of the qwen35 decoder and is ignored", m.dir(), t->name));
}

// The contract against the inventory: every folded name is a known ternary matrix with a sign vector
// of its K width and K a multiple of the block; the inverse list names only the embedding.
void check_contract(PackCheck& pc, const std::string& src) {
  const HadamardContract& h = pc.contract;
  if (!h.present) return;
  std::map<const TensorSpec*, TensorSource*> by_spec;
  for (auto& s : pc.sources) by_spec[s.spec] = &s;
  auto sign_ok = [&](const std::string& name, int64_t K) {
    if (h.block_size && K % h.block_size != 0)
      pc.problems.push_back(fmt::format("{}: '{}' has K = {}, not a multiple of prism.hadamard.block_size {}", src, name, K, h.block_size));
    if (h.sign_mode == "explicit" && !h.signs.count(K))
      pc.problems.push_back(fmt::format("{}: '{}' has K = {} but prism.hadamard.sign_widths has no vector of that width (widths: {})",
                                        src, name, K, fmt::join(h.sign_widths, ", ")));
  };
  std::set<std::string> seen;  // exact repeats are reported by the contract rules already
  for (const std::string& name : h.weight_names) {
    if (!seen.insert(name).second) continue;
    const TensorSpec* s = find_spec(pc.specs, name);
    if (!s) {
      pc.problems.push_back(fmt::format("{}: prism.hadamard.weight_names lists '{}', which is not a tensor of this model", src, name));
      continue;
    }
    if (s->kind != TensorKind::Ternary) {
      pc.problems.push_back(fmt::format("{}: prism.hadamard.weight_names lists '{}', which is not a ternary matrix; only ternary (PQ2_0/PTQ1_0) weights are folded", src, name));
      continue;
    }
    if (s->role == Role::TokenEmbd) {
      pc.problems.push_back(fmt::format("{}: prism.hadamard.weight_names lists the embedding '{}'; it belongs in inverse_weight_names", src, name));
      continue;
    }
    auto it = by_spec.find(s);
    if (it != by_spec.end()) {
      if (it->second->folded) {
        pc.problems.push_back(fmt::format("{}: prism.hadamard.weight_names lists '{}' twice (under two names)", src, name));
        continue;
      }
      it->second->folded = true;
    }
    sign_ok(name, s->cols());
  }
  for (const std::string& name : h.inverse_weight_names) {
    const TensorSpec* s = find_spec(pc.specs, name);
    if (!s || s->role != Role::TokenEmbd) {
      pc.problems.push_back(fmt::format("{}: prism.hadamard.inverse_weight_names lists '{}', expected only the token embedding (token_embd.weight)", src, name));
      continue;
    }
    auto it = by_spec.find(s);
    if (it != by_spec.end()) it->second->inverse = true;
    sign_ok(name, s->cols());
  }
}

}  // namespace

PackCheck check_pack(const Pack& pack) {
  PackCheck pc;
  try {
    pc.config = pack.gguf ? config_from_gguf(*pack.gguf) : config_from_hf(pack.mlx->text_config(), pack.mlx->file("config.json"));
    pc.config_ok = true;
  } catch (const Error& e) {
    pc.problems.push_back(e.what());
    return pc;
  }
  pc.specs = tensor_specs(pc.config);
  if (pack.gguf) {
    pc.contract = hadamard_from_gguf(*pack.gguf, pc.problems);
    check_gguf_tensors(*pack.gguf, pc);
    pc.gdn_tiled_in_file = true;  // the GGUF converter always writes V heads tiled
  } else {
    if (pack.mlx->hadamard()) pc.contract = hadamard_from_json(*pack.mlx->hadamard(), pack.mlx->file("hadamard.json"), pc.problems);
    check_mlx_tensors(*pack.mlx, pc);
    const auto& q = pack.mlx->config().value("quantization", nlohmann::json());
    if (q.is_object()) {
      if (q.value("bits", 2) != 2 || q.value("group_size", 128) != 128)
        pc.problems.push_back(fmt::format("{}: quantization is {}, expected bits 2 and group_size 128", pack.mlx->file("config.json"), q.dump()));
    }
  }
  check_contract(pc, pack.path);
  return pc;
}

}  // namespace bonsai
