// GGUF v3 reader and writer. The reader never trusts a count or a length from the file: every one is
// bounded by the bytes left before anything is allocated or read, so a hostile file is refused with a
// message instead of an allocation of 2^60 bytes or a read past the mapping.
#include "format/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string_view>

#include <fmt/ranges.h>

#include "format/atomic_file.h"
#include "util/error.h"
#include "util/progress.h"

namespace bonsai {

namespace {

constexpr uint32_t kDefaultAlignment = 32;
// Arrays of arrays are legal GGUF but nothing real nests deeper than 2; the cap bounds the reader's
// recursion so a file of nested array headers cannot exhaust the stack.
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;
// Caps that keep a hostile but internally consistent header (a multi-GB file of tiny entries) from
// exhausting memory: each GgufValue costs ~100 bytes however small its encoding. The real 27B pack has
// 851 tensors and ~750k metadata values (tokens, token types, merges).
constexpr uint64_t kMaxTensors = uint64_t(1) << 20;
constexpr uint64_t kMaxMetadataValues = uint64_t(1) << 24;
// Never reserve more than this up front from a count read from the file; vectors grow past it as real
// entries arrive.
constexpr uint64_t kMaxReserve = uint64_t(1) << 16;
// ggml stores ne as int64: anything at or above 2^63 elements / bytes is not a real tensor.
constexpr uint64_t kMaxI64 = uint64_t(std::numeric_limits<int64_t>::max());

struct GgmlTypeInfo {
  uint32_t id;
  const char* name;
  uint64_t block_elems;
  uint64_t block_bytes;
};

constexpr GgmlTypeInfo kGgmlTypes[] = {
    {ggml_type::F32, "F32", 1, 4},       {ggml_type::F16, "F16", 1, 2},
    {ggml_type::Q4_0, "Q4_0", 32, 18},   {ggml_type::Q4_1, "Q4_1", 32, 20},
    {ggml_type::Q5_0, "Q5_0", 32, 22},   {ggml_type::Q5_1, "Q5_1", 32, 24},
    {ggml_type::Q8_0, "Q8_0", 32, 34},   {ggml_type::Q8_1, "Q8_1", 32, 36},
    {ggml_type::I8, "I8", 1, 1},         {ggml_type::I16, "I16", 1, 2},
    {ggml_type::I32, "I32", 1, 4},       {ggml_type::I64, "I64", 1, 8},
    {ggml_type::F64, "F64", 1, 8},       {ggml_type::BF16, "BF16", 1, 2},
    {ggml_type::PQ2_0, "PQ2_0", 128, 34}, {ggml_type::PTQ1_0, "PTQ1_0", 128, 28},
};

const GgmlTypeInfo* ggml_info(uint32_t type) {
  for (const auto& t : kGgmlTypes)
    if (t.id == type) return &t;
  return nullptr;
}

bool gguf_type_valid(uint32_t t) { return t <= uint32_t(GgufType::FLOAT64); }
bool is_uint(GgufType t) {
  return t == GgufType::UINT8 || t == GgufType::UINT16 || t == GgufType::UINT32 || t == GgufType::UINT64;
}
bool is_int(GgufType t) {
  return t == GgufType::INT8 || t == GgufType::INT16 || t == GgufType::INT32 || t == GgufType::INT64;
}
bool is_float(GgufType t) { return t == GgufType::FLOAT32 || t == GgufType::FLOAT64; }

// On-disk size of a fixed-size value; 0 for STRING and ARRAY.
uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: case GgufType::ARRAY: return 0;
  }
  return 0;
}

// Fewest bytes one element of this type can take: bounds array counts before anything is reserved.
uint64_t min_encoded_size(GgufType t) {
  if (t == GgufType::STRING) return 8;   // u64 length, empty string
  if (t == GgufType::ARRAY) return 12;   // u32 element type + u64 count, empty array
  return scalar_size(t);
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
bool is_pow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }

// Bounds-checked little-endian cursor over the file bytes. `name` is the path (or the memory name)
// that prefixes every message.
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t size, const std::string& name) : p_(p), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const std::string& name() const { return name_; }

  // `what` describes the field for the message ("value of key 'x'"); it is only formatted on failure.
  template <typename What>
  void need(uint64_t n, const What& what) const {
    if (n > left())
      fail("{}: truncated: {} at offset {} needs {} bytes, only {} left in the file", name_, what(), pos_, n,
           left());
  }
  template <typename T, typename What>
  T get(const What& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <typename What>
  std::string get_string(const What& what) {
    const uint64_t len = get<uint64_t>(what);
    if (len > left())
      fail("{}: {} at offset {} claims a string of {} bytes, but only {} bytes are left in the file", name_,
           what(), pos_ - 8, len, left());
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

// Reads one value of type `t` (already read) for key `key`; arrays recurse up to kMaxArrayDepth.
// `budget` counts the values the file may still create (kMaxMetadataValues in all).
GgufValue read_value(Cursor& c, GgufType t, const std::string& key, int depth, uint64_t& budget) {
  auto what = [&] { return fmt::format("value of key '{}'", key); };
  if (budget == 0) fail("{}: key '{}': metadata holds more than {} values", c.name(), key, kMaxMetadataValues);
  --budget;
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::UINT8: v.u = c.get<uint8_t>(what); break;
    case GgufType::UINT16: v.u = c.get<uint16_t>(what); break;
    case GgufType::UINT32: v.u = c.get<uint32_t>(what); break;
    case GgufType::UINT64: v.u = c.get<uint64_t>(what); break;
    case GgufType::INT8: v.i = c.get<int8_t>(what); break;
    case GgufType::INT16: v.i = c.get<int16_t>(what); break;
    case GgufType::INT32: v.i = c.get<int32_t>(what); break;
    case GgufType::INT64: v.i = c.get<int64_t>(what); break;
    case GgufType::FLOAT32: v.f = c.get<float>(what); break;
    case GgufType::FLOAT64: v.f = c.get<double>(what); break;
    case GgufType::BOOL: {
      const uint8_t b = c.get<uint8_t>(what);
      // Anything but 0/1 means the file is corrupt or we are misreading it: refuse rather than guess.
      if (b > 1) fail("{}: key '{}': bool value must be 0 or 1, found {}", c.name(), key, b);
      v.b = b != 0;
      break;
    }
    case GgufType::STRING: v.s = c.get_string(what); break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        fail("{}: key '{}': arrays nested deeper than {} levels", c.name(), key, kMaxArrayDepth);
      const uint32_t et = c.get<uint32_t>([&] { return fmt::format("array element type of key '{}'", key); });
      if (!gguf_type_valid(et))
        fail("{}: key '{}': unknown array element type id {} (valid ids are 0..12)", c.name(), key, et);
      v.elem_type = GgufType(et);
      const uint64_t count = c.get<uint64_t>([&] { return fmt::format("array length of key '{}'", key); });
      const uint64_t min_size = min_encoded_size(v.elem_type);
      if (count > c.left() / min_size)
        fail("{}: key '{}': array of {} {} elements needs at least {} bytes each, but only {} bytes are left",
             c.name(), key, count, gguf_type_name(v.elem_type), min_size, c.left());
      if (count > budget)
        fail("{}: key '{}': array of {} elements would take the metadata past {} values", c.name(), key, count,
             kMaxMetadataValues);
      v.arr.reserve(size_t(std::min(count, kMaxReserve)));
      for (uint64_t k = 0; k < count; ++k) v.arr.push_back(read_value(c, v.elem_type, key, depth + 1, budget));
      break;
    }
  }
  return v;
}

// --- writer side ---------------------------------------------------------------------------------

class Sink {
 public:
  explicit Sink(std::vector<uint8_t>& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), b, b + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }

 private:
  std::vector<uint8_t>& out_;
};

void check_range(const std::string& key, const GgufValue& v, uint64_t umax, int64_t imin, int64_t imax) {
  if (is_uint(v.type) && v.u > umax)
    fail("GGUF writer: key '{}': value {} does not fit {}", key, v.u, gguf_type_name(v.type));
  if (is_int(v.type) && (v.i < imin || v.i > imax))
    fail("GGUF writer: key '{}': value {} does not fit {}", key, v.i, gguf_type_name(v.type));
}

// Writes the value body (no type tag); validates ranges and that array items match the element type,
// since a mismatch would silently produce a file that reads back differently.
void write_value(Sink& s, const std::string& key, const GgufValue& v, int depth) {
  switch (v.type) {
    case GgufType::UINT8: check_range(key, v, 0xff, 0, 0); s.put<uint8_t>(uint8_t(v.u)); break;
    case GgufType::UINT16: check_range(key, v, 0xffff, 0, 0); s.put<uint16_t>(uint16_t(v.u)); break;
    case GgufType::UINT32: check_range(key, v, 0xffffffffu, 0, 0); s.put<uint32_t>(uint32_t(v.u)); break;
    case GgufType::UINT64: s.put<uint64_t>(v.u); break;
    case GgufType::INT8: check_range(key, v, 0, INT8_MIN, INT8_MAX); s.put<int8_t>(int8_t(v.i)); break;
    case GgufType::INT16: check_range(key, v, 0, INT16_MIN, INT16_MAX); s.put<int16_t>(int16_t(v.i)); break;
    case GgufType::INT32: check_range(key, v, 0, INT32_MIN, INT32_MAX); s.put<int32_t>(int32_t(v.i)); break;
    case GgufType::INT64: s.put<int64_t>(v.i); break;
    case GgufType::FLOAT32:
      if (std::isfinite(v.f) && std::fabs(v.f) > double(std::numeric_limits<float>::max()))
        fail("GGUF writer: key '{}': value {} does not fit FLOAT32", key, v.f);
      s.put<float>(float(v.f));
      break;
    case GgufType::FLOAT64: s.put<double>(v.f); break;
    case GgufType::BOOL: s.put<uint8_t>(v.b ? 1 : 0); break;
    case GgufType::STRING: s.put_string(v.s); break;
    case GgufType::ARRAY:
      if (depth >= kMaxArrayDepth)
        fail("GGUF writer: key '{}': arrays nested deeper than {} levels", key, kMaxArrayDepth);
      if (!gguf_type_valid(uint32_t(v.elem_type)))
        fail("GGUF writer: key '{}': invalid array element type id {}", key, uint32_t(v.elem_type));
      s.put<uint32_t>(uint32_t(v.elem_type));
      s.put<uint64_t>(v.arr.size());
      for (size_t k = 0; k < v.arr.size(); ++k) {
        if (v.arr[k].type != v.elem_type)
          fail("GGUF writer: key '{}': array element {} is {}, expected {}", key, k, gguf_type_name(v.arr[k].type),
               gguf_type_name(v.elem_type));
        write_value(s, key, v.arr[k], depth + 1);
      }
      break;
    default:
      fail("GGUF writer: key '{}': invalid value type id {}", key, uint32_t(v.type));
  }
}

void check_shape(const std::string& what, uint32_t type, const std::vector<uint64_t>& ne) {
  if (ne.empty() || ne.size() > kMaxDims)
    fail("{}: has {} dimensions, expected 1..{}", what, ne.size(), kMaxDims);
  if (!ggml_type_known(type)) fail("{}: unknown ggml type id {}", what, type);
}

}  // namespace

// --- names and sizes -----------------------------------------------------------------------------

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "UINT8";
    case GgufType::INT8: return "INT8";
    case GgufType::UINT16: return "UINT16";
    case GgufType::INT16: return "INT16";
    case GgufType::UINT32: return "UINT32";
    case GgufType::INT32: return "INT32";
    case GgufType::FLOAT32: return "FLOAT32";
    case GgufType::BOOL: return "BOOL";
    case GgufType::STRING: return "STRING";
    case GgufType::ARRAY: return "ARRAY";
    case GgufType::UINT64: return "UINT64";
    case GgufType::INT64: return "INT64";
    case GgufType::FLOAT64: return "FLOAT64";
  }
  return "INVALID";
}

const char* ggml_type_name(uint32_t type) {
  if (const auto* t = ggml_info(type)) return t->name;
  // Unknown ids are rare and only reach messages: a small ring of buffers keeps the pointer valid
  // long enough for one fail(...) call without allocating a registry.
  static thread_local char buf[4][24];
  static thread_local int slot = 0;
  char* b = buf[slot++ & 3];
  std::snprintf(b, sizeof buf[0], "type#%u", type);
  return b;
}

bool ggml_type_known(uint32_t type) { return ggml_info(type) != nullptr; }
uint64_t ggml_block_elems(uint32_t type) {
  const auto* t = ggml_info(type);
  return t ? t->block_elems : 0;
}
uint64_t ggml_block_bytes(uint32_t type) {
  const auto* t = ggml_info(type);
  return t ? t->block_bytes : 0;
}

uint64_t ggml_tensor_bytes(uint32_t type, const std::vector<uint64_t>& ne, const std::string& what) {
  const auto* t = ggml_info(type);
  if (!t) fail("{}: unknown ggml type id {}", what, type);
  if (ne.empty()) fail("{}: has no dimensions", what);
  uint64_t elems = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] > kMaxI64 || __builtin_mul_overflow(elems, ne[d], &elems) || elems > kMaxI64)
      fail("{}: element count overflows (ne[{}] = {})", what, d, ne[d]);
  }
  if (ne[0] % t->block_elems != 0)
    fail("{}: row length ne[0] = {} is not a multiple of the {} block size {}", what, ne[0], t->name,
         t->block_elems);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elems / t->block_elems, t->block_bytes, &bytes) || bytes > kMaxI64)
    fail("{}: byte size overflows ({} elements of {})", what, elems, t->name);
  return bytes;
}

uint64_t GgufTensorInfo::elements() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;  // validated against overflow when parsed
  return n;
}

// --- GgufValue factories -------------------------------------------------------------------------

namespace {
GgufValue make_u(GgufType t, uint64_t x) {
  GgufValue v;
  v.type = t;
  v.u = x;
  return v;
}
GgufValue make_i(GgufType t, int64_t x) {
  GgufValue v;
  v.type = t;
  v.i = x;
  return v;
}
GgufValue make_f(GgufType t, double x) {
  GgufValue v;
  v.type = t;
  v.f = x;
  return v;
}
}  // namespace

GgufValue GgufValue::u8(uint8_t v) { return make_u(GgufType::UINT8, v); }
GgufValue GgufValue::i8(int8_t v) { return make_i(GgufType::INT8, v); }
GgufValue GgufValue::u16(uint16_t v) { return make_u(GgufType::UINT16, v); }
GgufValue GgufValue::i16(int16_t v) { return make_i(GgufType::INT16, v); }
GgufValue GgufValue::u32(uint32_t v) { return make_u(GgufType::UINT32, v); }
GgufValue GgufValue::i32(int32_t v) { return make_i(GgufType::INT32, v); }
GgufValue GgufValue::u64(uint64_t v) { return make_u(GgufType::UINT64, v); }
GgufValue GgufValue::i64(int64_t v) { return make_i(GgufType::INT64, v); }
GgufValue GgufValue::f32(float v) { return make_f(GgufType::FLOAT32, v); }
GgufValue GgufValue::f64(double v) { return make_f(GgufType::FLOAT64, v); }
GgufValue GgufValue::boolean(bool b) {
  GgufValue v;
  v.type = GgufType::BOOL;
  v.b = b;
  return v;
}
GgufValue GgufValue::str(std::string s) {
  GgufValue v;
  v.type = GgufType::STRING;
  v.s = std::move(s);
  return v;
}
GgufValue GgufValue::array(GgufType elem_type, std::vector<GgufValue> items) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.elem_type = elem_type;
  v.arr = std::move(items);
  return v;
}
GgufValue GgufValue::arr_str(const std::vector<std::string>& xs) {
  std::vector<GgufValue> items;
  items.reserve(xs.size());
  for (const auto& x : xs) items.push_back(str(x));
  return array(GgufType::STRING, std::move(items));
}
GgufValue GgufValue::arr_i32(const std::vector<int32_t>& xs) {
  std::vector<GgufValue> items;
  items.reserve(xs.size());
  for (int32_t x : xs) items.push_back(i32(x));
  return array(GgufType::INT32, std::move(items));
}
GgufValue GgufValue::arr_u32(const std::vector<uint32_t>& xs) {
  std::vector<GgufValue> items;
  items.reserve(xs.size());
  for (uint32_t x : xs) items.push_back(u32(x));
  return array(GgufType::UINT32, std::move(items));
}
GgufValue GgufValue::arr_f32(const std::vector<float>& xs) {
  std::vector<GgufValue> items;
  items.reserve(xs.size());
  for (float x : xs) items.push_back(f32(x));
  return array(GgufType::FLOAT32, std::move(items));
}

// --- reader --------------------------------------------------------------------------------------

GgufFile::GgufFile(const std::string& path) : path_(path), map_(std::make_shared<MappedFile>(path)) {
  base_ = map_->data();
  size_ = map_->size();
  parse();
}

GgufFile::GgufFile(const uint8_t* data, uint64_t size, std::string name)
    : path_(std::move(name)), base_(data), size_(size) {
  parse();
}

void GgufFile::parse() {
  const std::string& name = path_;
  // Check the magic before the header length so a non-GGUF file gets the more useful message.
  if (size_ >= 4 && std::memcmp(base_, "GGUF", 4) != 0)
    fail("{}: not a GGUF file: bad magic {:02x} {:02x} {:02x} {:02x}, expected 'GGUF' (47 47 55 46)", name, base_[0],
         base_[1], base_[2], base_[3]);
  if (size_ < 24)
    fail("{}: truncated: {} bytes is shorter than the 24-byte GGUF header (magic, version, counts)", name, size_);

  Cursor c(base_, size_, name);
  auto header = [] { return std::string("header"); };
  c.get<uint32_t>(header);  // magic, checked above
  version_ = c.get<uint32_t>(header);
  if (version_ != 3 && version_ != 2) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) fail("{}: big-endian GGUF (version {}) is not supported", name, swapped);
    if (version_ == 1) fail("{}: GGUF version 1 is not supported (expected 3; 2 accepted)", name);
    fail("{}: unsupported GGUF version {}, expected 3 (2 accepted)", name, version_);
  }
  const uint64_t n_tensors = c.get<uint64_t>(header);
  const uint64_t n_kv = c.get<uint64_t>(header);
  // Smallest possible entries: a kv is a u64 key length, 1 key byte, a u32 type and a 1-byte value;
  // a tensor info is a u64 name length, 1 name byte, u32 n_dims, one u64 ne, u32 type and u64 offset.
  constexpr uint64_t kMinKv = 8 + 1 + 4 + 1, kMinTensor = 8 + 1 + 4 + 8 + 4 + 8;
  if (n_kv > c.left() / kMinKv)
    fail("{}: header claims {} metadata entries, but the {} bytes left can hold at most {}", name, n_kv, c.left(),
         c.left() / kMinKv);
  if (n_tensors > c.left() / kMinTensor)
    fail("{}: header claims {} tensors, but the {} bytes left can hold at most {}", name, n_tensors, c.left(),
         c.left() / kMinTensor);

  if (n_tensors > kMaxTensors)
    fail("{}: header claims {} tensors, more than the {} this reader accepts", name, n_tensors, kMaxTensors);
  if (n_kv > kMaxMetadataValues)
    fail("{}: header claims {} metadata entries, more than the {} this reader accepts", name, n_kv,
         kMaxMetadataValues);

  uint64_t budget = kMaxMetadataValues;
  key_order_.reserve(size_t(std::min(n_kv, kMaxReserve)));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.get_string([&] { return fmt::format("key of metadata entry #{}", k); });
    if (key.empty()) fail("{}: metadata entry #{} has an empty key", name, k);
    const uint32_t t = c.get<uint32_t>([&] { return fmt::format("value type of key '{}'", key); });
    if (!gguf_type_valid(t)) fail("{}: key '{}' has unknown value type id {} (valid ids are 0..12)", name, key, t);
    GgufValue v = read_value(c, GgufType(t), key, 0, budget);
    auto [it, inserted] = kv_.emplace(key, std::move(v));
    if (!inserted) fail("{}: duplicate metadata key '{}'", name, key);
    key_order_.push_back(std::move(key));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::UINT32)
      fail("{}: key 'general.alignment' has type {}, expected UINT32", name, gguf_type_name(a->type));
    if (!is_pow2(a->u) || a->u > kMaxGgufAlignment)
      fail("{}: key 'general.alignment' must be a power of two in 1..{}, found {}", name, kMaxGgufAlignment, a->u);
    alignment_ = uint32_t(a->u);
  }

  tensors_.reserve(size_t(std::min(n_tensors, kMaxReserve)));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo ti;
    ti.name = c.get_string([&] { return fmt::format("name of tensor #{}", k); });
    if (ti.name.empty()) fail("{}: tensor #{} has an empty name", name, k);
    auto field = [&](const char* f) { return [&ti, f] { return fmt::format("{} of tensor '{}'", f, ti.name); }; };
    const uint32_t n_dims = c.get<uint32_t>(field("n_dims"));
    if (n_dims < 1 || n_dims > kMaxDims)
      fail("{}: tensor '{}' has n_dims {}, expected 1..{}", name, ti.name, n_dims, kMaxDims);
    ti.ne.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) ti.ne[d] = c.get<uint64_t>(field("ne"));
    ti.type = c.get<uint32_t>(field("type"));
    ti.offset = c.get<uint64_t>(field("offset"));
    if (!ggml_type_known(ti.type))
      fail("{}: tensor '{}' has unknown or unsupported ggml type id {}", name, ti.name, ti.type);
    ti.nbytes = ggml_tensor_bytes(ti.type, ti.ne, fmt::format("{}: tensor '{}'", name, ti.name));
    if (ti.offset % alignment_ != 0)
      fail("{}: tensor '{}' data offset {} is not a multiple of the alignment {}", name, ti.name, ti.offset,
           alignment_);
    auto [it, inserted] = tensor_index_.emplace(ti.name, tensors_.size());
    if (!inserted) fail("{}: duplicate tensor name '{}'", name, ti.name);
    tensors_.push_back(std::move(ti));
  }

  data_offset_ = align_up(c.pos(), alignment_);  // pos <= size < 2^63 and alignment <= 2^31: no overflow
  if (tensors_.empty()) return;
  if (data_offset_ > size_)
    fail("{}: data section would start at offset {} (alignment {}), past the end of the {}-byte file", name,
         data_offset_, alignment_, size_);
  const uint64_t data_size = size_ - data_offset_;
  for (auto& ti : tensors_) {
    if (ti.offset > data_size || ti.nbytes > data_size - ti.offset)
      fail("{}: tensor '{}' data [{}, {}) relative to the data section (file offset {}) ends past the end of the "
           "file: the data section holds {} bytes",
           name, ti.name, ti.offset, ti.offset + ti.nbytes, data_offset_, data_size);
    ti.data = base_ + data_offset_ + ti.offset;
  }
  // Overlapping tensors would silently alias each other's weights; no writer produces them.
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  const GgufTensorInfo* prev = nullptr;
  for (size_t idx : order) {
    const GgufTensorInfo& ti = tensors_[idx];
    if (ti.nbytes == 0) continue;
    if (prev && ti.offset < prev->offset + prev->nbytes)
      fail("{}: tensor '{}' data [{}, {}) overlaps tensor '{}' data [{}, {})", name, ti.name, ti.offset,
           ti.offset + ti.nbytes, prev->name, prev->offset, prev->offset + prev->nbytes);
    prev = &ti;
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

const GgufValue& require(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) fail("{}: required key '{}' is missing", f.path(), key);
  return *v;
}

[[noreturn]] void wrong_type(const GgufFile& f, const std::string& key, const GgufValue& v, const char* expected) {
  if (v.type == GgufType::ARRAY)
    fail("{}: key '{}' has type ARRAY of {}, expected {}", f.path(), key, gguf_type_name(v.elem_type), expected);
  fail("{}: key '{}' has type {}, expected {}", f.path(), key, gguf_type_name(v.type), expected);
}

// Integer value as a signed 128-bit number so every range check is one comparison.
__int128 int_of(const GgufValue& v) { return is_uint(v.type) ? __int128(v.u) : __int128(v.i); }

template <typename T>
T int_in_range(const GgufFile& f, const std::string& key, const GgufValue& v, const char* expected) {
  if (!is_uint(v.type) && !is_int(v.type)) wrong_type(f, key, v, expected);
  const __int128 x = int_of(v);
  if (x < __int128(std::numeric_limits<T>::min()) || x > __int128(std::numeric_limits<T>::max())) {
    if (is_uint(v.type)) fail("{}: key '{}' value {} does not fit {}", f.path(), key, v.u, expected);
    fail("{}: key '{}' value {} does not fit {}", f.path(), key, v.i, expected);
  }
  return T(x);
}

const GgufValue& require_array(const GgufFile& f, const std::string& key, const char* expected) {
  const GgufValue& v = require(f, key);
  if (v.type != GgufType::ARRAY) wrong_type(f, key, v, expected);
  return v;
}

}  // namespace

uint32_t GgufFile::get_u32(const std::string& key) const {
  return int_in_range<uint32_t>(*this, key, require(*this, key), "u32");
}
uint64_t GgufFile::get_u64(const std::string& key) const {
  return int_in_range<uint64_t>(*this, key, require(*this, key), "u64");
}
int64_t GgufFile::get_i64(const std::string& key) const {
  return int_in_range<int64_t>(*this, key, require(*this, key), "i64");
}
float GgufFile::get_f32(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (!is_float(v.type)) wrong_type(*this, key, v, "FLOAT32 or FLOAT64");
  // A finite FLOAT64 beyond the float range would be undefined behaviour to convert, and wrong anyway.
  if (std::isfinite(v.f) && std::fabs(v.f) > double(std::numeric_limits<float>::max()))
    fail("{}: key '{}' value {} does not fit f32", path_, key, v.f);
  return float(v.f);
}
bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::BOOL) wrong_type(*this, key, v, "BOOL");
  return v.b;
}
std::string GgufFile::get_str(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (v.type != GgufType::STRING) wrong_type(*this, key, v, "STRING");
  return v.s;
}

std::vector<std::string> GgufFile::get_arr_str(const std::string& key) const {
  const GgufValue& v = require_array(*this, key, "ARRAY of STRING");
  if (v.elem_type != GgufType::STRING) wrong_type(*this, key, v, "ARRAY of STRING");
  std::vector<std::string> out;
  out.reserve(v.arr.size());
  for (const auto& e : v.arr) out.push_back(e.s);
  return out;
}

std::vector<int64_t> GgufFile::get_arr_int(const std::string& key) const {
  const GgufValue& v = require_array(*this, key, "ARRAY of integers");
  if (!is_uint(v.elem_type) && !is_int(v.elem_type)) wrong_type(*this, key, v, "ARRAY of integers");
  std::vector<int64_t> out;
  out.reserve(v.arr.size());
  for (size_t k = 0; k < v.arr.size(); ++k) {
    const GgufValue& e = v.arr[k];
    if (is_uint(e.type) && e.u > kMaxI64)
      fail("{}: key '{}' element {} value {} does not fit i64", path_, key, k, e.u);
    out.push_back(is_uint(e.type) ? int64_t(e.u) : e.i);
  }
  return out;
}

std::vector<double> GgufFile::get_arr_num(const std::string& key) const {
  const GgufValue& v = require_array(*this, key, "ARRAY of numbers");
  if (!is_uint(v.elem_type) && !is_int(v.elem_type) && !is_float(v.elem_type))
    wrong_type(*this, key, v, "ARRAY of numbers");
  std::vector<double> out;
  out.reserve(v.arr.size());
  for (const auto& e : v.arr) out.push_back(is_uint(e.type) ? double(e.u) : is_int(e.type) ? double(e.i) : e.f);
  return out;
}

std::optional<uint32_t> GgufFile::opt_u32(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_u32(key);
}
std::optional<float> GgufFile::opt_f32(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_f32(key);
}
std::optional<bool> GgufFile::opt_bool(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_bool(key);
}
std::optional<std::string> GgufFile::opt_str(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_str(key);
}

// --- writer --------------------------------------------------------------------------------------

void GgufWriter::set_alignment(uint32_t a) {
  if (!is_pow2(a) || a > kMaxGgufAlignment)
    fail("GGUF writer: alignment must be a power of two in 1..{}, got {}", kMaxGgufAlignment, a);
  alignment_ = a;
  if (a != kDefaultAlignment) {
    set("general.alignment", GgufValue::u32(a));
  } else {
    // The default needs no key; readers assume 32 when it is absent.
    std::erase_if(kv_, [](const auto& kv) { return kv.first == "general.alignment"; });
  }
}

void GgufWriter::set(const std::string& key, GgufValue v) {
  if (key.empty()) fail("GGUF writer: empty metadata key");
  if (key == "general.alignment") {
    // Keep the key and the layout the writer uses in agreement, whichever way the caller set it.
    if (v.type != GgufType::UINT32 || !is_pow2(v.u) || v.u > kMaxGgufAlignment)
      fail("GGUF writer: key 'general.alignment' must be a UINT32 power of two in 1..{}", kMaxGgufAlignment);
    alignment_ = uint32_t(v.u);
  }
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::add_tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne,
                            std::vector<uint8_t> bytes) {
  const std::string what = fmt::format("GGUF writer: tensor '{}'", name);
  if (name.empty()) fail("GGUF writer: empty tensor name");
  check_shape(what, type, ne);
  const uint64_t nbytes = ggml_tensor_bytes(type, ne, what);
  if (bytes.size() != nbytes) fail("{}: has {} bytes, expected {} for {} {}", what, bytes.size(), nbytes,
                                   ggml_type_name(type), fmt::join(ne, "x"));
  for (const auto& t : tensors_)
    if (t.name == name) fail("GGUF writer: duplicate tensor name '{}'", name);
  tensors_.push_back(Pending{name, type, std::move(ne), nbytes, std::move(bytes), nullptr});
}

void GgufWriter::add_tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne, Fill fill) {
  const std::string what = fmt::format("GGUF writer: tensor '{}'", name);
  if (name.empty()) fail("GGUF writer: empty tensor name");
  if (!fill) fail("{}: empty fill callback", what);
  check_shape(what, type, ne);
  const uint64_t nbytes = ggml_tensor_bytes(type, ne, what);
  for (const auto& t : tensors_)
    if (t.name == name) fail("GGUF writer: duplicate tensor name '{}'", name);
  tensors_.push_back(Pending{name, type, std::move(ne), nbytes, {}, std::move(fill)});
}

namespace {

// Header bytes (kvs + tensor infos) padded to the alignment: the data section starts right after.
std::vector<uint8_t> build_header(const std::vector<std::pair<std::string, GgufValue>>& kvs,
                                  const auto& tensors, uint32_t alignment) {
  std::vector<uint8_t> out;
  Sink s(out);
  s.put<uint32_t>(0x46554747);  // "GGUF" little-endian
  s.put<uint32_t>(3);
  s.put<uint64_t>(tensors.size());
  s.put<uint64_t>(kvs.size());
  for (const auto& [key, v] : kvs) {
    s.put_string(key);
    s.put<uint32_t>(uint32_t(v.type));
    write_value(s, key, v, 0);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    s.put_string(t.name);
    s.put<uint32_t>(uint32_t(t.ne.size()));
    for (uint64_t d : t.ne) s.put<uint64_t>(d);
    s.put<uint32_t>(t.type);
    s.put<uint64_t>(offset);
    offset += align_up(t.nbytes, alignment);
  }
  out.resize(align_up(out.size(), alignment), 0);
  return out;
}

}  // namespace

uint64_t GgufWriter::total_bytes() const {
  uint64_t total = build_header(kv_, tensors_, alignment_).size();
  for (const auto& t : tensors_) total += align_up(t.nbytes, alignment_);
  return total;
}

void GgufWriter::write(const std::string& path, Progress* progress) const {
  const std::vector<uint8_t> header = build_header(kv_, tensors_, alignment_);
  AtomicFile out(path);
  out.write(header.data(), header.size());
  if (progress) progress->advance(header.size());

  // One scratch buffer, grown to the largest filled tensor and reused: a multi-GB pack streams
  // through it without ever holding more than one tensor.
  std::unique_ptr<uint8_t[]> scratch;  // [nbytes of the largest Fill tensor so far], u8
  uint64_t scratch_size = 0;
  for (const auto& t : tensors_) {
    const uint8_t* src = t.bytes.data();
    if (t.fill) {
      if (scratch_size < t.nbytes) {
        scratch.reset(new uint8_t[t.nbytes]);
        scratch_size = t.nbytes;
      }
      // Zeroed first so a Fill that leaves bytes untouched still gives a deterministic file.
      std::memset(scratch.get(), 0, t.nbytes);
      t.fill(scratch.get(), t.nbytes);
      src = scratch.get();
    }
    out.write(src, t.nbytes);
    const uint64_t pad = align_up(t.nbytes, alignment_) - t.nbytes;
    out.write_zeros(pad);
    if (progress) progress->advance(t.nbytes + pad);
  }
  out.commit();
}

}  // namespace bonsai
