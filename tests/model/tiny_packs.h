// The tiny preset written in every format, shared by the whole-model tests. ctest runs each test in its
// own process, so the packs are written once per ctest run (keyed by the parent pid and this binary's
// mtime, guarded by a lock file) rather than once per test.
#pragma once
#include <gtest/gtest.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "pack/make_pack.h"

namespace bonsai::testing_support {

struct TinyPacks {
  std::string dir, pq2, ptq1, mlx, effective;
};

// Folders of earlier ctest runs (named tag_<ctest pid>_<mtime>) whose ctest process is gone: removed, so
// the ~1 GB a run writes does not pile up in the temp dir. A live run's folders (its pid still exists)
// are left alone.
inline void remove_stale_pack_dirs(const std::string& tag) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(::testing::TempDir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(tag + "_", 0) != 0) continue;
    const std::string rest = name.substr(tag.size() + 1);
    const size_t us = rest.find('_');
    if (us == std::string::npos || rest.find_first_not_of("0123456789_.lock") != std::string::npos) continue;
    const pid_t pid = pid_t(std::atol(rest.substr(0, us).c_str()));
    if (pid <= 1 || kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::filesystem::remove_all(e.path(), ec);
  }
}

// Writes the packs `o` describes into a folder named `tag` (o.out_dir is set here) once per ctest run
// and returns the paths of the formats written (empty for formats not asked for).
inline TinyPacks write_packs_once(const std::string& tag, MakePackOptions o) {
  TinyPacks t;
  remove_stale_pack_dirs(tag);
  struct stat st {};
  stat("/proc/self/exe", &st);
  t.dir = ::testing::TempDir() + "/" + tag + "_" + std::to_string(getppid()) + "_" + std::to_string(st.st_mtime);
  std::filesystem::create_directories(t.dir);
  const int lock = open((t.dir + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  flock(lock, LOCK_EX);
  o.out_dir = t.dir;
  const std::string done = t.dir + "/complete";
  if (!std::filesystem::exists(done)) {
    make_pack(o);
    std::ofstream(done) << "ok\n";
  }
  flock(lock, LOCK_UN);
  close(lock);
  auto path = [&](const char* format) {
    const bool all = o.formats.empty();
    const bool asked = all || std::find(o.formats.begin(), o.formats.end(), format) != o.formats.end();
    return asked ? t.dir + "/" + pack_output_name(o, format) : std::string();
  };
  t.pq2 = path("gguf-pq2_0");
  t.ptq1 = path("gguf-ptq1_0");
  t.mlx = path("mlx");
  t.effective = path("effective");
  return t;
}

// The tiny preset, seed 7, in every format.
inline const TinyPacks& tiny_packs() {
  static const TinyPacks p = [] {
    MakePackOptions o;
    o.seed = 7;
    return write_packs_once("bonsai_tiny", o);
  }();
  return p;
}

}  // namespace bonsai::testing_support
