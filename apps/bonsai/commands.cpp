#include "commands.h"

namespace bonsai::cli {

void register_commands(CLI::App& app) {
  (void)app;
}

}  // namespace bonsai::cli
