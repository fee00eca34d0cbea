// What `bonsai chat` and `bonsai run --chat` share (cmd_chat.cpp): the chat options and the one-shot
// chat completion behind `run --chat`.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace bonsai::cli {

struct ChatCliArgs {
  // model and engine (run's options, copied by cmd_run.cpp for --chat)
  std::string model;
  std::string prompt;  // run --chat -p
  int64_t n = -1;      // tokens per reply; < 0: until a stop id or the context is full
  SamplerOptions sampling;
  int64_t ctx = 0;
  int threads = 0;
  std::string act;  // --act: activation precision of the ternary products ("": the backend default)
  std::string backend = "cpu";
  bool json = false;
  bool ignore_eos = false;
  // chat
  std::string system;
  std::string think = "on";
  std::string chat_format = "auto";
  std::string template_file;
  std::string history = "keep";
  std::vector<std::string> stop;
  std::string color = "auto";
  bool verbose = false;
};

// --system --think --chat-format --chat-template-file --stop --color (+ --history when `multi_turn`);
// returns them (so `run` can make each need --chat).
std::vector<CLI::Option*> add_chat_options(CLI::App* cmd, ChatCliArgs& a, bool multi_turn);

// bonsai run --chat: render the prompt with the chat template, generate, print reasoning apart from the
// answer (the answer alone on stdout when it is not a terminal), a footer on stderr.
void run_chat_once(const ChatCliArgs& a);

}  // namespace bonsai::cli
