// Subcommand registration. Each cmd_<name>.cpp defines register_<name>(CLI::App&).
#pragma once
#include <CLI/CLI.hpp>

namespace bonsai::cli {

// Thrown by a subcommand to exit with a specific code after printing its own output
// (e.g. inspect of an invalid pack exits 2, gate below threshold exits 3).
struct ExitCode {
  int code;
};

void register_commands(CLI::App& app);

}  // namespace bonsai::cli
