// bonsai make-pack: write packs the way the real converter does (see src/pack/make_pack.h).
#include <cstdio>

#include "commands.h"
#include "pack/make_pack.h"
#include "util/progress.h"

namespace bonsai::cli {

void register_make_pack(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-pack", "Write a pack (GGUF PQ2_0 / PTQ1_0, MLX folder, effective float weights) from a preset and a seed");
  auto opt = std::make_shared<MakePackOptions>();
  auto formats = std::make_shared<std::string>();
  cmd->add_option("--preset", opt->preset, "Model shape: tiny (a few MB, real structure) or 27b (real shapes, random codes)")
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "Seed of the drawn weights")->capture_default_str();
  cmd->add_option("--format", *formats,
                  "Comma-separated: gguf-pq2_0, gguf-ptq1_0, mlx, effective (default: all the preset supports)");
  cmd->add_option("-o,--out", opt->out_dir, "Output folder")->capture_default_str();
  cmd->add_flag("--no-hadamard", [opt](int64_t) { opt->hadamard = false; }, "Write an unrotated pack of the same float model");
  cmd->callback([opt, formats] {
    opt->formats.clear();
    std::string f = *formats;
    for (size_t a = 0; !f.empty() && a <= f.size();) {
      size_t b = f.find(',', a);
      if (b == std::string::npos) b = f.size();
      if (b > a) opt->formats.push_back(f.substr(a, b - a));
      a = b + 1;
    }
    opt->progress = stderr_is_tty();
    const MakePackResult r = make_pack(*opt);
    for (const auto& p : r.paths) std::printf("%s\n", p.c_str());
  });
}

}  // namespace bonsai::cli
