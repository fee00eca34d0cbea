// GGUF v3 reader and writer (little-endian). Format: magic "GGUF", u32 version, u64 tensor count,
// u64 kv count, kvs (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 ne[n_dims],
// u32 ggml type, u64 offset relative to the data section), padding to general.alignment (default 32),
// tensor data. Strings are u64 length + bytes (no NUL). Arrays are u32 element type + u64 count + elements,
// and may nest (arrays of arrays, arrays of strings).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/mapped_file.h"

namespace bonsai {

class Progress;

// Largest general.alignment accepted (real packs use 32). Bounding it keeps the padding a writer or
// reader may have to materialise small (found by fuzzing: a 2^31 alignment made the writer allocate 2 GB).
constexpr uint32_t kMaxGgufAlignment = 1u << 16;

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GgufType t);

// ggml tensor types the project knows (others are refused with the id in the message).
namespace ggml_type {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
                   I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
                   PQ2_0 = 142, PTQ1_0 = 143;
}
const char* ggml_type_name(uint32_t type);          // "PQ2_0", ..., or "type#N"
bool ggml_type_known(uint32_t type);
uint64_t ggml_block_elems(uint32_t type);             // elements per block (128 for PQ2_0/PTQ1_0, 1 for F32)
uint64_t ggml_block_bytes(uint32_t type);             // bytes per block (34 for PQ2_0, 28 for PTQ1_0, 4 for F32)
// Bytes of a tensor with ne[0] = K (row length) and the given element count; throws if K is not a
// multiple of the block size.
uint64_t ggml_tensor_bytes(uint32_t type, const std::vector<uint64_t>& ne, const std::string& what);

// One metadata value. Scalars live in u/i/f/b/s by category; arrays keep their element type and items.
struct GgufValue {
  GgufType type = GgufType::UINT32;
  GgufType elem_type = GgufType::UINT32;  // ARRAY only
  uint64_t u = 0;       // UINT8/16/32/64
  int64_t i = 0;        // INT8/16/32/64
  double f = 0;         // FLOAT32/64
  bool b = false;       // BOOL
  std::string s;        // STRING
  std::vector<GgufValue> arr;  // ARRAY

  static GgufValue u8(uint8_t v);
  static GgufValue i8(int8_t v);
  static GgufValue u16(uint16_t v);
  static GgufValue i16(int16_t v);
  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue i64(int64_t v);
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v);
  static GgufValue str(std::string v);
  static GgufValue arr_str(const std::vector<std::string>& v);
  static GgufValue arr_i32(const std::vector<int32_t>& v);
  static GgufValue arr_u32(const std::vector<uint32_t>& v);
  static GgufValue arr_f32(const std::vector<float>& v);
  static GgufValue array(GgufType elem_type, std::vector<GgufValue> items);
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;              // ggml_type
  std::vector<uint64_t> ne;       // ne[0] is the row length K (GGUF order, fastest first)
  uint64_t offset = 0;            // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
  uint64_t elements() const;
};

class GgufFile {
 public:
  // Maps and parses the file; every structural problem throws Error naming the path and the key /
  // tensor / field with what was expected. Validates: magic, version (3; 2 accepted), counts against the
  // file size, string lengths, value types, alignment (power of two), duplicate keys and tensor names,
  // n_dims 1..4, element-count overflow, known tensor types, offsets aligned and data inside the file.
  explicit GgufFile(const std::string& path);
  // Parse from memory (fuzzing, tests). `data` must outlive the object.
  GgufFile(const uint8_t* data, uint64_t size, std::string name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of the data section
  uint64_t file_size() const { return size_; }
  const uint8_t* file_data() const { return base_; }
  const MappedFile* mapping() const { return map_.get(); }
  // The mapping as a shared owner: views into it (a loaded model's PQ2_0 weights) keep it alive after
  // this object is gone. nullptr for a file parsed from memory.
  std::shared_ptr<const MappedFile> shared_mapping() const { return map_; }

  const std::vector<std::string>& keys() const { return key_order_; }
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters: throw Error "<path>: key '<key>' ..." when missing or of the wrong category.
  // Integer getters accept any integer type whose value fits; float getters accept f32/f64.
  uint32_t get_u32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_str(const std::string& key) const;
  std::vector<std::string> get_arr_str(const std::string& key) const;
  std::vector<int64_t> get_arr_int(const std::string& key) const;   // any integer element type
  std::vector<double> get_arr_num(const std::string& key) const;    // any integer or float element type
  // Optional variants: nullopt when the key is absent, throw when present with the wrong type.
  std::optional<uint32_t> opt_u32(const std::string& key) const;
  std::optional<float> opt_f32(const std::string& key) const;
  std::optional<bool> opt_bool(const std::string& key) const;
  std::optional<std::string> opt_str(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;

 private:
  void parse();
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Writes GGUF v3. Keys are written in insertion order; tensors in insertion order, each at an offset
// aligned to general.alignment (the writer adds general.alignment when set_alignment was called with a
// value other than 32). Writes to "<path>.tmp" and renames on success, so a failed write never leaves a
// half file under the final name.
class GgufWriter {
 public:
  using Fill = std::function<void(uint8_t* dst, uint64_t nbytes)>;
  void set_alignment(uint32_t a);
  void set(const std::string& key, GgufValue v);  // replaces an existing key in place
  // Tensor with its bytes now (nbytes must equal ggml_tensor_bytes(type, ne)).
  void add_tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne, std::vector<uint8_t> bytes);
  // Tensor whose bytes are produced at write time (streams multi-GB packs without holding them).
  void add_tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne, Fill fill);
  uint64_t total_bytes() const;  // size of the file write() will produce
  void write(const std::string& path, Progress* progress = nullptr) const;

 private:
  struct Pending {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    uint64_t nbytes;
    std::vector<uint8_t> bytes;
    Fill fill;
  };
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Pending> tensors_;
};

}  // namespace bonsai
