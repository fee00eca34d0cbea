// The tiny preset written in every format, shared by the whole-model tests. ctest runs each test in its
// own process, so the packs are written once per ctest run (keyed by the parent pid and this binary's
// mtime, guarded by a lock file) rather than once per test.
#pragma once
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <fcntl.h>

#include <filesystem>
#include <string>

#include "pack/make_pack.h"

namespace bonsai::testing_support {

struct TinyPacks {
  std::string dir, pq2, ptq1, mlx, effective;
};

inline const TinyPacks& tiny_packs() {
  static const TinyPacks p = [] {
    TinyPacks t;
    struct stat st {};
    stat("/proc/self/exe", &st);
    t.dir = ::testing::TempDir() + "/bonsai_tiny_" + std::to_string(getppid()) + "_" + std::to_string(st.st_mtime);
    std::filesystem::create_directories(t.dir);
    const int lock = open((t.dir + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
    flock(lock, LOCK_EX);
    MakePackOptions o;
    o.out_dir = t.dir;
    o.seed = 7;
    const std::string done = t.dir + "/complete";
    if (!std::filesystem::exists(done)) {
      make_pack(o);
      std::ofstream(done) << "ok\n";
    }
    flock(lock, LOCK_UN);
    close(lock);
    t.pq2 = t.dir + "/" + pack_output_name(o, "gguf-pq2_0");
    t.ptq1 = t.dir + "/" + pack_output_name(o, "gguf-ptq1_0");
    t.mlx = t.dir + "/" + pack_output_name(o, "mlx");
    t.effective = t.dir + "/" + pack_output_name(o, "effective");
    return t;
  }();
  return p;
}

}  // namespace bonsai::testing_support
