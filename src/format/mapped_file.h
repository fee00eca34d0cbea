// A read-only memory-mapped file. The mapping lives as long as the object; views into it are raw
// pointers whose lifetime the owner of the MappedFile manages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace bonsai {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws Error naming the path (missing, unreadable, empty ok)
  ~MappedFile();
  MappedFile(MappedFile&&) noexcept;
  MappedFile& operator=(MappedFile&&) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Hint the kernel that [offset, offset+len) will be read sequentially / is no longer needed
  // (MADV_SEQUENTIAL + WILLNEED + POPULATE_READ / MADV_DONTNEED): lets a loader that copies tensors out keep RSS near one copy.
  void advise_sequential(uint64_t offset, uint64_t len) const;
  // Make [offset, offset+len) resident and mapped now (MADV_POPULATE_READ; WILLNEED where the kernel
  // lacks it), for ranges used in place for the life of the mapping (no SEQUENTIAL: it would mark the
  // pages as read-once for reclaim).
  void populate(uint64_t offset, uint64_t len) const;
  void release(uint64_t offset, uint64_t len) const;
  // Bytes of the mapping the kernel maps with 2 MiB entries now (FilePmdMapped of its /proc/self/smaps
  // entry; 0 when unknown). For reports: weights used in place stream faster in huge pages.
  uint64_t huge_mapped_bytes() const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace bonsai
