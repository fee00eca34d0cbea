// Writes a file atomically: bytes go to "<path>.tmp", which commit() flushes, fsyncs and renames onto
// <path>. If the object is destroyed without commit() (an exception, a failed Fill), the temporary is
// removed, so a failed write never leaves a half file under the final name.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace bonsai {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // throws Error naming the .tmp path
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* p, uint64_t n);
  void write_zeros(uint64_t n);
  uint64_t written() const { return written_; }
  void commit();

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace bonsai
