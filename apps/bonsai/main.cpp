// bonsai: the command-line entry point. Each subcommand lives in its own cmd_*.cpp and registers
// itself through register_commands (commands.h); errors from the library are caught here, once.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"bonsai: runtime for PrismML Bonsai 2 ternary + Hadamard models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "bonsai 0.1.0");
  bonsai::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const bonsai::cli::ExitCode& e) {
    return e.code;
  } catch (const bonsai::Error& e) {
    std::fprintf(stderr, "bonsai: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bonsai: internal error: %s\n", e.what());
    return 70;
  }
  return 0;
}
