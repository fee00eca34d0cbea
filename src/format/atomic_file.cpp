#include "format/atomic_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include "util/error.h"

namespace bonsai {

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) fail("{}: cannot create: {}", tmp_, std::strerror(errno));
  // A big stdio buffer: headers and padding are many small writes; large tensor bodies bypass it.
  std::setvbuf(f_, nullptr, _IOFBF, size_t(8) << 20);
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* p, uint64_t n) {
  if (n == 0) return;
  if (std::fwrite(p, 1, size_t(n), f_) != size_t(n))
    fail("{}: write of {} bytes at offset {} failed: {}", tmp_, n, written_, std::strerror(errno));
  written_ += n;
}

void AtomicFile::write_zeros(uint64_t n) {
  static const uint8_t zeros[4096] = {};
  while (n) {
    const uint64_t k = std::min<uint64_t>(n, sizeof zeros);
    write(zeros, k);
    n -= k;
  }
}

void AtomicFile::commit() {
  if (std::fflush(f_) != 0) fail("{}: write failed: {}", tmp_, std::strerror(errno));
  // fsync before rename: otherwise a crash can leave the final name pointing at a truncated file.
  if (::fsync(fileno(f_)) != 0) fail("{}: fsync failed: {}", tmp_, std::strerror(errno));
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) fail("{}: close failed: {}", tmp_, std::strerror(errno));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail("{}: cannot rename {} onto it: {}", path_, tmp_, std::strerror(errno));
  committed_ = true;
}

}  // namespace bonsai
