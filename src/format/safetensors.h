// safetensors reader and writer. Format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}},
// then the data buffer; offsets are relative to the buffer start.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/mapped_file.h"

namespace bonsai {

enum class StDtype { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64 };
const char* st_dtype_name(StDtype t);  // "F16", ...
uint64_t st_dtype_size(StDtype t);

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<uint64_t> shape;  // row-major, outermost first (PyTorch / numpy order)
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  uint64_t elements() const;
};

class SafetensorsFile {
 public:
  // Validates: header length inside the file and below a sane bound, JSON well formed, known dtypes,
  // shapes whose byte size matches data_offsets, offsets inside the buffer, no overlap, no duplicate names.
  explicit SafetensorsFile(const std::string& path);
  SafetensorsFile(const uint8_t* data, uint64_t size, std::string name);  // fuzzing, tests

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const StTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void parse(const uint8_t* data, uint64_t size);
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors in insertion order, 8-byte aligned header; "<path>.tmp" then rename.
class SafetensorsWriter {
 public:
  using Fill = std::function<void(uint8_t* dst, uint64_t nbytes)>;
  void set_metadata(const std::string& key, const std::string& value);
  void add(const std::string& name, StDtype dtype, std::vector<uint64_t> shape, std::vector<uint8_t> bytes);
  void add(const std::string& name, StDtype dtype, std::vector<uint64_t> shape, Fill fill);
  void write(const std::string& path) const;

 private:
  struct Pending {
    std::string name;
    StDtype dtype;
    std::vector<uint64_t> shape;
    uint64_t nbytes;
    std::vector<uint8_t> bytes;
    Fill fill;
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Pending> tensors_;
};

}  // namespace bonsai
