#include "format/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
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
  // Map at a 2 MiB-aligned address (file offset 0 on a huge-page boundary) and ask for huge pages: the
  // kernel can then map 2 MiB page-cache folios with one PMD entry each. Models use their weights in place
  // from this mapping, and on this class of VM streaming 7 GB per token through 4 KiB mappings is
  // measurably slower (TLB walks; a plain 2-thread read: ~20 vs ~30 GB/s). Faults through a MADV_HUGEPAGE
  // mapping also make the kernel read a cold file into 2 MiB folios (kernels with large-folio page caches).
  constexpr uint64_t kHuge = uint64_t(2) << 20;
  void* p = MAP_FAILED;
  if (size_ >= kHuge) {
    void* r = ::mmap(nullptr, size_t(size_ + kHuge), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r != MAP_FAILED) {
      const uintptr_t base = reinterpret_cast<uintptr_t>(r), aligned = (base + kHuge - 1) & ~uintptr_t(kHuge - 1);
      p = ::mmap(reinterpret_cast<void*>(aligned), size_t(size_), PROT_READ, MAP_PRIVATE | MAP_FIXED, fd.fd, 0);
      if (p == MAP_FAILED) {
        ::munmap(r, size_t(size_ + kHuge));
      } else {  // release the unused head and tail of the reservation
        if (aligned > base) ::munmap(r, aligned - base);
        const uintptr_t end = base + size_ + kHuge, used = aligned + ((size_ + page_size() - 1) & ~(page_size() - 1));
        if (end > used) ::munmap(reinterpret_cast<void*>(used), end - used);
        ::madvise(p, size_t(size_), MADV_HUGEPAGE);  // best effort
      }
    }
  }
  if (p == MAP_FAILED) p = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd.fd, 0);
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

uint64_t MappedFile::huge_mapped_bytes() const {
  if (!data_) return 0;
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[512];
  bool in_vma = false;
  uint64_t kb = 0;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data_);
  while (std::fgets(line, sizeof line, f)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
      in_vma = lo <= start && start < hi;  // a VMA header line
      continue;
    }
    unsigned long long v = 0;
    if (in_vma && std::sscanf(line, "FilePmdMapped: %llu kB", &v) == 1) {
      kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

}  // namespace bonsai
