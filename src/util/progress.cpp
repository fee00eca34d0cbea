#include "util/progress.h"

#include <cstdio>
#include <unistd.h>

namespace bonsai {

bool stderr_is_tty() { return isatty(2) != 0; }

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::advance(uint64_t n) {
  done_ += n;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ > std::chrono::milliseconds(200)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void Progress::draw(bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = total_ ? double(done_) / double(total_) : 1.0;
  const int width = 30, filled = int(frac * width);
  std::string bar(size_t(filled), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %.1f/%.1f MB %.1fs%s", label_.c_str(), bar.c_str(), frac * 100.0,
               double(done_) / 1e6, double(total_) / 1e6, secs, final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace bonsai
