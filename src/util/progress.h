// A one-line progress bar on stderr for long work (writing the 27b pack, loading, transcoding).
// Silent when stderr is not a terminal unless forced, so logs and tests stay clean.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace bonsai {

class Progress {
 public:
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress();
  void advance(uint64_t n);  // thread-compatible, not thread-safe
  void finish();

 private:
  std::string label_;
  uint64_t total_, done_ = 0;
  bool enabled_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  void draw(bool final);
};

bool stderr_is_tty();

}  // namespace bonsai
