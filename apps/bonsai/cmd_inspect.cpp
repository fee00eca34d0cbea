// bonsai inspect PACK [--json] [--load]: what a pack holds and whether it is valid (exit 2 when not).
// --load also loads it into the canonical model and reports the time (including making the weights
// resident: a PQ2_0 pack's are used in place, populated with MADV_POPULATE_READ), the peak RSS, the bytes
// used in place, and the time of one sequential read of the same bytes (done first: the load runs warm).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <vector>

#include "commands.h"
#include "model/pack.h"
#include "model/pack_report.h"
#include "tokenizer/gguf_vocabulary.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "util/error.h"
#include "util/progress.h"

namespace bonsai::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return uint64_t(ru.ru_maxrss) * 1024;
}

// Seconds to read every byte of the pack's files once with read() into a small buffer.
double sequential_read_seconds(const std::vector<std::string>& files) {
  std::vector<char> buf(8 << 20);
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) fail("{}: cannot open for reading", f);
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
  }
  return seconds_since(t0);
}

nlohmann::ordered_json tokenizer_info(const Pack& pack) {
  nlohmann::ordered_json t;
  try {
    Vocabulary v;
    bool have_template = false;
    if (pack.gguf) {
      if (!pack.gguf->has("tokenizer.ggml.tokens")) return {{"present", false}};
      v = vocabulary_from_gguf(*pack.gguf);
      have_template = pack.gguf->has("tokenizer.chat_template");
    } else {
      if (!pack.mlx->has_file("tokenizer.json")) return {{"present", false}};
      v = vocabulary_from_hf_dir(pack.mlx->dir());
      have_template = pack.mlx->has_file("chat_template.jinja");
    }
    t["present"] = true;
    t["tokens"] = v.size();
    t["merges"] = v.merges.size();
    t["pre"] = v.pre;
    t["eos_id"] = v.eos_id;
    t["stop_ids"] = v.stop_ids();
    t["chat_template"] = have_template;
  } catch (const Error& e) {
    t["present"] = true;
    t["error"] = e.what();
  }
  return t;
}

void print_text(const nlohmann::ordered_json& j) {
  auto gb = [](uint64_t b) { return double(b) / 1e9; };
  std::printf("%s: %s, %.3f GB\n", j["path"].get<std::string>().c_str(), j["format"].get<std::string>().c_str(),
              gb(j["file_bytes"].get<uint64_t>()));
  if (j.contains("architecture")) {
    const auto& h = j["hyperparameters"];
    std::printf("architecture %s: %ld layers (%s), hidden %ld, ffn %ld, heads %ld/%ld x %ld, vocab %ld, ctx %ld\n",
                j["architecture"].get<std::string>().c_str(), h["block_count"].get<long>(),
                j["layers"]["pattern"].get<std::string>().c_str(), h["embedding_length"].get<long>(),
                h["feed_forward_length"].get<long>(), h["head_count"].get<long>(), h["head_count_kv"].get<long>(),
                h["head_dim"].get<long>(), h["vocab"].get<long>(), h["context_length"].get<long>());
    std::printf("gated deltanet: %ld k-heads, %ld v-heads x %ld, conv %ld; rope %ld dims, theta %g; layers: %ld full attention, %ld GDN\n",
                h["ssm_k_heads"].get<long>(), h["ssm_v_heads"].get<long>(), h["ssm_head_dim"].get<long>(),
                h["ssm_conv_kernel"].get<long>(), h["rope_dims"].get<long>(), h["rope_theta"].get<double>(),
                j["layers"]["full_attention"].get<long>(), j["layers"]["gated_deltanet"].get<long>());
  }
  std::printf("tensors: %lu, %.3f GB\n", j["tensors"]["count"].get<unsigned long>(), gb(j["tensors"]["bytes"].get<uint64_t>()));
  for (const auto& t : j["tensors"]["by_type"])
    std::printf("  %-40s %5lu  %.3f GB\n", t["type"].get<std::string>().c_str(), t["count"].get<unsigned long>(),
                gb(t["bytes"].get<uint64_t>()));
  std::printf("bytes read per decoded token: %.3f GB\n", gb(j["bytes_per_token"].get<uint64_t>()));
  const auto& h = j["hadamard"];
  if (h["present"].get<bool>()) {
    std::printf("hadamard: block %u, %s, %zu folded, %zu inverse, %ld unrotated ternary", h["block_size"].get<unsigned>(),
                h["sign_mode"].get<std::string>().c_str(), h["folded"].get<size_t>(), h["inverse"].get<size_t>(),
                h["unrotated_ternary"].get<long>());
    if (h.contains("gdn_v_grouped")) std::printf(", gdn_v_grouped %s", h["gdn_v_grouped"].get<bool>() ? "true" : "false");
    std::printf("\n");
    for (const auto& w : h["sign_widths"])
      std::printf("  signs width %ld (%ld blocks): %ld negative\n", w["width"].get<long>(), w["blocks"].get<long>(),
                  w["negative"].get<long>());
  } else {
    std::printf("hadamard: none (unrotated pack)\n");
  }
  if (j.contains("tokenizer")) {
    const auto& t = j["tokenizer"];
    if (!t["present"].get<bool>()) std::printf("tokenizer: none\n");
    else if (t.contains("error")) std::printf("tokenizer: INVALID: %s\n", t["error"].get<std::string>().c_str());
    else
      std::printf("tokenizer: %zu tokens, %zu merges, pre %s, eos %d, chat template %s\n", t["tokens"].get<size_t>(),
                  t["merges"].get<size_t>(), t["pre"].get<std::string>().c_str(), t["eos_id"].get<int>(),
                  t["chat_template"].get<bool>() ? "yes" : "no");
  }
  if (j.contains("load")) {
    const auto& l = j["load"];
    std::printf("load: %.2f s (sequential read of the file %.2f s, ratio %.2f), peak RSS %.3f GB (%.2fx the pack), "
                "%.3f GB of ternary weights used in place, %.3f GB of the pack mapped in 2 MiB pages\n",
                l["seconds"].get<double>(), l["sequential_read_seconds"].get<double>(), l["ratio_to_read"].get<double>(),
                gb(l["peak_rss_bytes"].get<uint64_t>()), l["rss_to_pack"].get<double>(),
                gb(l["ternary_bytes_in_place"].get<uint64_t>()), gb(l["huge_page_mapped_bytes"].get<uint64_t>()));
  }
  for (const auto& w : j["warnings"]) std::printf("warning: %s\n", w.get<std::string>().c_str());
  if (j["valid"].get<bool>()) {
    std::printf("valid: true\n");
  } else {
    std::printf("valid: false (%zu problems)\n", j["problems"].size());
    for (const auto& p : j["problems"]) std::printf("  - %s\n", p.get<std::string>().c_str());
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe and validate a pack (GGUF file or MLX folder)");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto load = std::make_shared<bool>(false);
  cmd->add_option("pack", *path, "GGUF file or MLX folder")->required();
  cmd->add_flag("--json", *json, "Print JSON");
  cmd->add_flag("--load", *load, "Also load the weights; report time and peak RSS against one sequential read");
  cmd->callback([path, json, load] {
    const Pack pack = open_pack(*path);
    const PackCheck check = check_pack(pack);
    nlohmann::ordered_json j = inspect_pack(pack, check);
    j["tokenizer"] = tokenizer_info(pack);
    if (*load && check.valid()) {
      const std::vector<std::string> files = pack.gguf ? std::vector<std::string>{pack.path} : pack.mlx->shard_paths();
      const double read_s = sequential_read_seconds(files);  // also warms the page cache
      auto t0 = std::chrono::steady_clock::now();
      LoadOptions lo;
      lo.progress = !*json && stderr_is_tty();
      const Model m = load_model(pack, lo);
      const double load_s = seconds_since(t0);
      const uint64_t rss = peak_rss_bytes();
      // Ternary bytes used in place from the mapped pack (GGUF PQ2_0: all of them) vs copied at load.
      uint64_t in_place = 0;
      std::set<const uint8_t*> seen;  // a tied head shares the table's blocks
      for (const TernaryMatrix* t : m.ternary_matrices())
        if (!t->owned && seen.insert(t->blocks).second) in_place += t->bytes();
      j["load"] = {{"seconds", load_s},
                   {"sequential_read_seconds", read_s},
                   {"ratio_to_read", read_s > 0 ? load_s / read_s : 0.0},
                   {"peak_rss_bytes", rss},
                   {"rss_to_pack", double(rss) / double(pack.file_bytes)},
                   {"canonical_bytes", m.total_weight_bytes()},
                   {"ternary_bytes_in_place", in_place},
                   {"huge_page_mapped_bytes", pack.gguf && pack.gguf->mapping() ? pack.gguf->mapping()->huge_mapped_bytes() : 0}};
    }
    if (*json) std::printf("%s\n", j.dump(2).c_str());
    else print_text(j);
    if (!check.valid()) throw ExitCode{2};
  });
}

}  // namespace bonsai::cli
