#include "format/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "util/error.h"

namespace bonsai {

namespace {

// Closes the descriptor on every path out of the constructor; the mapping outlives it.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t page_size() {
  static const uint64_t p = uint64_t(::sysconf(_SC_PAGESIZE));
  return p;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  // A directory or a FIFO opens fine but cannot be mapped; say so instead of a puzzling mmap errno.
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  size_ = uint64_t(st.st_size);
  if (size_ == 0) return;  // mmap of length 0 is EINVAL; an empty file is a valid (empty) mapping
  void* p = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (p == MAP_FAILED) fail("{}: cannot map {} bytes: {}", path, size_, std::strerror(errno));
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_t(size_));
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_t(size_));
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

// Both hints are best effort: a failing madvise changes performance, never results, so errors are ignored.
void MappedFile::advise_sequential(uint64_t offset, uint64_t len) const {
  if (!data_ || offset >= size_ || len == 0) return;
  const uint64_t end = len > size_ - offset ? size_ : offset + len;
  // madvise needs a page-aligned start; widening the range outward only widens the read-ahead.
  const uint64_t start = offset & ~(page_size() - 1);
  ::madvise(const_cast<uint8_t*>(data_) + start, size_t(end - start), MADV_SEQUENTIAL);
  ::madvise(const_cast<uint8_t*>(data_) + start, size_t(end - start), MADV_WILLNEED);
#ifdef MADV_POPULATE_READ
  // Map every page of the range in one call instead of one fault per 4 KiB page on first read
  // (Linux >= 5.14; older kernels return EINVAL and the reads fault as usual).
  ::madvise(const_cast<uint8_t*>(data_) + start, size_t(end - start), MADV_POPULATE_READ);
#endif
}

void MappedFile::populate(uint64_t offset, uint64_t len) const {
  if (!data_ || offset >= size_ || len == 0) return;
  const uint64_t end = len > size_ - offset ? size_ : offset + len;
  const uint64_t start = offset & ~(page_size() - 1);
  uint8_t* p = const_cast<uint8_t*>(data_) + start;
#ifdef MADV_POPULATE_READ
  if (::madvise(p, size_t(end - start), MADV_POPULATE_READ) == 0) return;
#endif
  ::madvise(p, size_t(end - start), MADV_WILLNEED);  // older kernels: start the read-ahead at least
}

void MappedFile::release(uint64_t offset, uint64_t len) const {
  if (!data_ || offset >= size_ || len == 0) return;
  const uint64_t end_req = len > size_ - offset ? size_ : offset + len;
  // Shrink inward to whole pages so neighbours still being read keep their pages. The last partial
  // page of the file counts as whole (the mapping ends there). Dropping clean private pages is safe:
  // the next access re-reads them from the file.
  const uint64_t ps = page_size();
  const uint64_t start = (offset + ps - 1) & ~(ps - 1);
  const uint64_t end = end_req == size_ ? size_ : end_req & ~(ps - 1);
  if (end <= start) return;
  ::madvise(const_cast<uint8_t*>(data_) + start, size_t(end - start), MADV_DONTNEED);
}

}  // namespace bonsai
