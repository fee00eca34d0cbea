#include "commands.h"

namespace bonsai::cli {

void register_make_pack(CLI::App& app);
void register_inspect(CLI::App& app);
void register_run(CLI::App& app);
void register_gate(CLI::App& app);
void register_bench(CLI::App& app);
void register_chat(CLI::App& app);

void register_commands(CLI::App& app) {
  register_make_pack(app);
  register_inspect(app);
  register_run(app);
  register_gate(app);
  register_bench(app);
  register_chat(app);
}

}  // namespace bonsai::cli
