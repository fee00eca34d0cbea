// safetensors reader and writer. The header is JSON, parsed with nlohmann::json; everything the JSON
// claims (dtype, shape, offsets) is checked against the real buffer before a pointer is handed out.
#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include <fmt/ranges.h>

#include "format/atomic_file.h"
#include "util/error.h"

namespace bonsai {

namespace {

// Same bound as the reference implementation: a real header (thousands of tensors) is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The schema needs depth 3 (top object, tensor object, shape array); the cap keeps hostile input from
// building deep DOM trees.
constexpr int kMaxJsonDepth = 16;

struct DtypeInfo {
  StDtype dtype;
  const char* name;
  uint64_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {StDtype::BOOL, "BOOL", 1}, {StDtype::U8, "U8", 1},     {StDtype::I8, "I8", 1},     {StDtype::U16, "U16", 2},
    {StDtype::I16, "I16", 2},   {StDtype::F16, "F16", 2},   {StDtype::BF16, "BF16", 2}, {StDtype::U32, "U32", 4},
    {StDtype::I32, "I32", 4},   {StDtype::F32, "F32", 4},   {StDtype::U64, "U64", 8},   {StDtype::I64, "I64", 8},
    {StDtype::F64, "F64", 8},
};

const DtypeInfo* dtype_info(StDtype t) {
  for (const auto& d : kDtypes)
    if (d.dtype == t) return &d;
  return nullptr;
}

const DtypeInfo* dtype_by_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* json_kind(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer: return "a negative integer";
    case nlohmann::json::value_t::number_unsigned: return "an unsigned integer";
    case nlohmann::json::value_t::number_float: return "a non-integer number";
    default: return "an unexpected JSON value";
  }
}

// Element count and byte size of a shape; throws on overflow.
uint64_t shape_bytes(const std::string& what, const std::vector<uint64_t>& shape, uint64_t elem_size) {
  uint64_t n = 1;
  for (uint64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) fail("{}: shape {} overflows the element count", what, fmt::join(shape, "x"));
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, elem_size, &bytes)) fail("{}: shape {} overflows the byte size", what, fmt::join(shape, "x"));
  return bytes;
}

}  // namespace

const char* st_dtype_name(StDtype t) {
  const auto* d = dtype_info(t);
  return d ? d->name : "INVALID";
}

uint64_t st_dtype_size(StDtype t) {
  const auto* d = dtype_info(t);
  return d ? d->size : 0;
}

uint64_t StTensor::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // validated against overflow when parsed
  return n;
}

// --- reader --------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(std::make_unique<MappedFile>(path)) {
  parse(map_->data(), map_->size());
}

SafetensorsFile::SafetensorsFile(const uint8_t* data, uint64_t size, std::string name) : path_(std::move(name)) {
  parse(data, size);
}

void SafetensorsFile::parse(const uint8_t* data, uint64_t size) {
  const std::string& name = path_;
  if (size < 8) fail("{}: truncated: {} bytes, a safetensors file starts with an 8-byte header length", name, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the {}-byte limit (not a safetensors file?)", name, header_len,
         kMaxHeaderBytes);
  if (header_len > size - 8)
    fail("{}: truncated: header length {} but only {} bytes follow the length field", name, header_len, size - 8);
  if (header_len < 2) fail("{}: header length {} is too small for a JSON object", name, header_len);

  const char* hbegin = reinterpret_cast<const char*>(data + 8);
  const uint8_t* buffer = data + 8 + header_len;  // [buffer_size] u8, tensor offsets are relative to it
  const uint64_t buffer_size = size - 8 - header_len;

  // nlohmann keeps the last of duplicate keys silently, so duplicates are caught while parsing: one set
  // of keys per open object. The callback also caps nesting depth.
  std::vector<std::set<std::string>> open_objects;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) -> bool {
    using E = nlohmann::json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= kMaxJsonDepth)
      fail("{}: header JSON is nested deeper than {} levels", name, kMaxJsonDepth);
    if (ev == E::object_start) open_objects.emplace_back();
    if (ev == E::object_end && !open_objects.empty()) open_objects.pop_back();
    if (ev == E::key && !open_objects.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second) {
        if (open_objects.size() == 1) fail("{}: duplicate tensor name '{}' in the header", name, k);
        fail("{}: duplicate JSON key '{}' in the header", name, k);
      }
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hbegin, hbegin + header_len, on_event);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header is not valid JSON: {}", name, e.what());
  }
  if (!header.is_object()) fail("{}: header JSON is {}, expected an object", name, json_kind(header));

  for (auto entry = header.begin(); entry != header.end(); ++entry) {
    // Named references, not a structured binding: lambdas below capture them (clang 14 refuses bindings).
    const std::string& key = entry.key();
    const nlohmann::json& val = entry.value();
    if (key == "__metadata__") {
      if (!val.is_object()) fail("{}: '__metadata__' is {}, expected an object of strings", name, json_kind(val));
      for (const auto& [mk, mv] : val.items()) {
        if (!mv.is_string())
          fail("{}: '__metadata__' entry '{}' is {}, expected a string", name, mk, json_kind(mv));
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (key.empty()) fail("{}: tensor with an empty name", name);
    if (!val.is_object()) fail("{}: tensor '{}' entry is {}, expected an object", name, key, json_kind(val));
    auto field = [&](const char* f) -> const nlohmann::json& {
      auto it = val.find(f);
      if (it == val.end()) fail("{}: tensor '{}' has no '{}'", name, key, f);
      return *it;
    };
    StTensor t;
    t.name = key;

    const auto& jd = field("dtype");
    if (!jd.is_string()) fail("{}: tensor '{}' dtype is {}, expected a string", name, key, json_kind(jd));
    const auto* di = dtype_by_name(jd.get_ref<const std::string&>());
    if (!di)
      fail("{}: tensor '{}' has unknown dtype '{}' (expected one of BOOL U8 I8 U16 I16 F16 BF16 U32 I32 F32 U64 "
           "I64 F64)",
           name, key, jd.get_ref<const std::string&>());
    t.dtype = di->dtype;

    const auto& js = field("shape");
    if (!js.is_array()) fail("{}: tensor '{}' shape is {}, expected an array", name, key, json_kind(js));
    t.shape.reserve(js.size());
    for (size_t d = 0; d < js.size(); ++d) {
      if (!js[d].is_number_unsigned())
        fail("{}: tensor '{}' shape[{}] is {}, expected a non-negative integer", name, key, d, json_kind(js[d]));
      t.shape.push_back(js[d].get<uint64_t>());
    }
    const std::string what = fmt::format("{}: tensor '{}'", name, key);
    t.nbytes = shape_bytes(what, t.shape, di->size);

    const auto& jo = field("data_offsets");
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      fail("{}: tensor '{}' data_offsets must be [begin, end] of two non-negative integers, found {}", name, key,
           jo.dump());
    const uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (begin > end) fail("{}: tensor '{}' data_offsets [{}, {}] has begin after end", name, key, begin, end);
    if (end > buffer_size)
      fail("{}: tensor '{}' data_offsets [{}, {}] ends past the {}-byte data buffer (file truncated?)", name, key,
           begin, end, buffer_size);
    if (end - begin != t.nbytes)
      fail("{}: tensor '{}' data_offsets [{}, {}] span {} bytes, expected {} for {} {}", name, key, begin, end,
           end - begin, t.nbytes, di->name, fmt::join(t.shape, "x"));
    t.data = buffer + begin;
    tensors_.push_back(std::move(t));
  }

  // File order is data order; it also makes the overlap check one pass.
  std::sort(tensors_.begin(), tensors_.end(), [](const StTensor& a, const StTensor& b) {
    return a.data != b.data ? a.data < b.data : a.name < b.name;
  });
  const StTensor* prev = nullptr;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const StTensor& t = tensors_[k];
    index_[t.name] = k;
    if (t.nbytes == 0) continue;
    if (prev && t.data < prev->data + prev->nbytes)
      fail("{}: tensor '{}' data [{}, {}) overlaps tensor '{}' data [{}, {})", name, t.name, t.data - buffer,
           t.data - buffer + t.nbytes, prev->name, prev->data - buffer, prev->data - buffer + prev->nbytes);
    prev = &t;
  }
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// --- writer --------------------------------------------------------------------------------------

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

namespace {
void check_new_tensor(const std::string& name, StDtype dtype, const std::vector<std::string>& existing) {
  if (name.empty()) fail("safetensors writer: empty tensor name");
  if (name == "__metadata__") fail("safetensors writer: '__metadata__' is reserved, not a tensor name");
  if (!dtype_info(dtype)) fail("safetensors writer: tensor '{}': invalid dtype id {}", name, int(dtype));
  if (std::find(existing.begin(), existing.end(), name) != existing.end())
    fail("safetensors writer: duplicate tensor name '{}'", name);
}
}  // namespace

void SafetensorsWriter::add(const std::string& name, StDtype dtype, std::vector<uint64_t> shape,
                            std::vector<uint8_t> bytes) {
  std::vector<std::string> names;
  for (const auto& t : tensors_) names.push_back(t.name);
  check_new_tensor(name, dtype, names);
  const std::string what = fmt::format("safetensors writer: tensor '{}'", name);
  const uint64_t nbytes = shape_bytes(what, shape, st_dtype_size(dtype));
  if (bytes.size() != nbytes)
    fail("{}: has {} bytes, expected {} for {} {}", what, bytes.size(), nbytes, st_dtype_name(dtype),
         fmt::join(shape, "x"));
  tensors_.push_back(Pending{name, dtype, std::move(shape), nbytes, std::move(bytes), nullptr});
}

void SafetensorsWriter::add(const std::string& name, StDtype dtype, std::vector<uint64_t> shape, Fill fill) {
  std::vector<std::string> names;
  for (const auto& t : tensors_) names.push_back(t.name);
  check_new_tensor(name, dtype, names);
  const std::string what = fmt::format("safetensors writer: tensor '{}'", name);
  if (!fill) fail("{}: empty fill callback", what);
  const uint64_t nbytes = shape_bytes(what, shape, st_dtype_size(dtype));
  tensors_.push_back(Pending{name, dtype, std::move(shape), nbytes, {}, std::move(fill)});
}

void SafetensorsWriter::write(const std::string& path) const {
  // ordered_json keeps insertion order, so the header lists tensors in data order like the data itself.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    h[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string json;
  try {
    json = h.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: cannot encode the safetensors header: {}", path, e.what());
  }
  // Pad with spaces (valid JSON whitespace) so the data buffer starts 8-byte aligned in the file.
  json.resize((json.size() + 7) / 8 * 8, ' ');
  const uint64_t header_len = json.size();

  AtomicFile out(path);
  out.write(&header_len, 8);
  out.write(json.data(), json.size());
  std::unique_ptr<uint8_t[]> scratch;  // [largest Fill tensor] u8, reused across tensors
  uint64_t scratch_size = 0;
  for (const auto& t : tensors_) {
    const uint8_t* src = t.bytes.data();
    if (t.fill) {
      if (scratch_size < t.nbytes) {
        scratch.reset(new uint8_t[t.nbytes]);
        scratch_size = t.nbytes;
      }
      std::memset(scratch.get(), 0, t.nbytes);  // deterministic bytes even if Fill skips some
      t.fill(scratch.get(), t.nbytes);
      src = scratch.get();
    }
    out.write(src, t.nbytes);
  }
  out.commit();
}

}  // namespace bonsai
