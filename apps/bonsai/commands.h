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

// --act's help (run, chat, gate, bench).
inline constexpr const char* kActHelp =
    "Activation precision of the ternary products: cpu f32|q8|q16|q24 (default q16), cuda q8|q16|f16|exact (default "
    "q16); q8 is the fastest, held to the stated looser bound --min-agreement 0.95 --max-delta 0.6 --max-kl 4e-3 "
    "(README, Parity)";

}  // namespace bonsai::cli
