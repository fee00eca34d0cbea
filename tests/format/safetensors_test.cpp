#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "format/safetensors.h"
#include "format_test_util.h"
#include "util/error.h"

using namespace bonsai;
using testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public testing_support::TempDirTest {
 protected:
  SafetensorsTest() : TempDirTest("bonsai_st") {}
};

using testing_support::error_of;
using testing_support::read_all;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);  // [n] u8
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 13);
  return v;
}

// A file from a literal JSON header and `data_size` bytes of buffer (pattern filled).
std::vector<uint8_t> st_bytes(const std::string& json, size_t data_size) {
  const uint64_t n = json.size();
  const auto d = pattern(data_size, 1);
  std::vector<uint8_t> out(8 + n + data_size);  // [u64 n][n bytes JSON][data_size bytes]
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, json.data(), n);
  if (data_size) std::memcpy(out.data() + 8 + n, d.data(), data_size);
  return out;
}

std::string st_error(const std::vector<uint8_t>& bytes) {
  std::string msg = error_of([&] { SafetensorsFile f(bytes.data(), bytes.size(), "broken.safetensors"); });
  EXPECT_THAT(msg, HasSubstr("broken.safetensors"));
  return msg;
}

std::string st_error(const std::string& json, size_t data_size) { return st_error(st_bytes(json, data_size)); }

}  // namespace

TEST_F(SafetensorsTest, RoundTripsEveryDtypeShapeAndMetadata) {
  struct T {
    std::string name;
    StDtype dtype;
    std::vector<uint64_t> shape;
  };
  const std::vector<T> ts = {
      {"bool", StDtype::BOOL, {3}},       {"u8", StDtype::U8, {2, 3}},      {"i8", StDtype::I8, {5}},
      {"u16", StDtype::U16, {1, 1, 3}},   {"i16", StDtype::I16, {2}},       {"f16", StDtype::F16, {4, 2}},
      {"bf16", StDtype::BF16, {3, 1}},    {"u32", StDtype::U32, {7}},       {"i32", StDtype::I32, {2, 2}},
      {"f32", StDtype::F32, {}},          {"u64", StDtype::U64, {1}},       {"i64", StDtype::I64, {2}},
      {"f64", StDtype::F64, {3}},         {"empty", StDtype::F32, {0, 5}},
      {"language_model.model.layers.0.mlp.gate_proj.weight", StDtype::U32, {4, 8}},
  };
  SafetensorsWriter w;
  w.set_metadata("format", "mlx");
  w.set_metadata("note", "h\xc3\xa9 \"quoted\"");
  std::vector<std::vector<uint8_t>> data;
  for (size_t k = 0; k < ts.size(); ++k) {
    uint64_t n = st_dtype_size(ts[k].dtype);
    for (uint64_t d : ts[k].shape) n *= d;
    data.push_back(pattern(n, uint8_t(k * 17)));
    w.add(ts[k].name, ts[k].dtype, ts[k].shape, data.back());
  }
  w.write(path("a.safetensors"));

  const auto raw = read_all(path("a.safetensors"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);  // data buffer starts 8-byte aligned
  EXPECT_EQ(raw[8], '{');

  SafetensorsFile f(path("a.safetensors"));
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "mlx"}, {"note", "h\xc3\xa9 \"quoted\""}}));
  ASSERT_EQ(f.tensors().size(), ts.size());
  const uint8_t* buffer = nullptr;
  for (size_t k = 0; k < ts.size(); ++k) {
    const StTensor* t = f.find(ts[k].name);
    ASSERT_NE(t, nullptr) << ts[k].name;
    EXPECT_EQ(t->name, ts[k].name);
    EXPECT_EQ(t->dtype, ts[k].dtype) << ts[k].name;
    EXPECT_EQ(t->shape, ts[k].shape) << ts[k].name;
    EXPECT_EQ(t->nbytes, data[k].size());
    EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), data[k]) << ts[k].name;
    if (k == 0) buffer = t->data;
  }
  EXPECT_EQ(buffer, f.tensors()[0].data);
  EXPECT_EQ(f.find("f32")->elements(), 1u);  // a scalar
  EXPECT_EQ(f.find("empty")->elements(), 0u);
  EXPECT_EQ(f.find("absent"), nullptr);
  // tensors() is in data order, which is the writer's insertion order.
  for (size_t k = 1; k < f.tensors().size(); ++k) EXPECT_LE(f.tensors()[k - 1].data, f.tensors()[k].data);

  SafetensorsFile m(raw.data(), raw.size(), "mem");
  EXPECT_EQ(m.path(), "mem");
  EXPECT_EQ(m.tensors().size(), ts.size());
}

TEST_F(SafetensorsTest, DtypeNamesAndSizes) {
  EXPECT_STREQ(st_dtype_name(StDtype::BF16), "BF16");
  EXPECT_STREQ(st_dtype_name(StDtype::BOOL), "BOOL");
  EXPECT_EQ(st_dtype_size(StDtype::BOOL), 1u);
  EXPECT_EQ(st_dtype_size(StDtype::F16), 2u);
  EXPECT_EQ(st_dtype_size(StDtype::U32), 4u);
  EXPECT_EQ(st_dtype_size(StDtype::F64), 8u);
}

TEST_F(SafetensorsTest, FillCallbacksProduceTheSameFileAsByteVectors) {
  const auto a = pattern(4 * 16 * 4, 3), b = pattern(4 * 2 * 2, 5), c = pattern(6, 9);
  auto build = [&](bool use_fill) {
    SafetensorsWriter w;
    w.set_metadata("k", "v");
    auto add = [&](const std::string& name, StDtype dt, std::vector<uint64_t> shape, const std::vector<uint8_t>& bytes) {
      if (use_fill)
        w.add(name, dt, shape, [&bytes](uint8_t* dst, uint64_t n) { std::memcpy(dst, bytes.data(), n); });
      else
        w.add(name, dt, shape, bytes);
    };
    add("c", StDtype::U8, {6}, c);
    add("a", StDtype::U32, {4, 16}, a);
    add("b", StDtype::F16, {4, 2}, b);
    return w;
  };
  build(true).write(path("fill.safetensors"));
  build(false).write(path("bytes.safetensors"));
  EXPECT_EQ(read_all(path("fill.safetensors")), read_all(path("bytes.safetensors")));
}

TEST_F(SafetensorsTest, WriterRefusals) {
  SafetensorsWriter w;
  EXPECT_THAT(error_of([&] { w.add("t", StDtype::F32, {2, 2}, std::vector<uint8_t>(15)); }),
              HasSubstr("tensor 't': has 15 bytes, expected 16 for F32 2x2"));
  EXPECT_THAT(error_of([&] { w.add("__metadata__", StDtype::U8, {1}, std::vector<uint8_t>(1)); }),
              HasSubstr("'__metadata__' is reserved"));
  EXPECT_THAT(error_of([&] { w.add("", StDtype::U8, {1}, std::vector<uint8_t>(1)); }), HasSubstr("empty tensor name"));
  w.add("t", StDtype::U8, {1}, std::vector<uint8_t>(1));
  EXPECT_THAT(error_of([&] { w.add("t", StDtype::U8, {1}, std::vector<uint8_t>(1)); }),
              HasSubstr("duplicate tensor name 't'"));
  SafetensorsWriter f;
  f.add("x", StDtype::U8, {4}, [](uint8_t*, uint64_t) { throw Error("fill failed"); });
  EXPECT_THAT(error_of([&] { f.write(path("x.safetensors")); }), HasSubstr("fill failed"));
  EXPECT_FALSE(fs::exists(path("x.safetensors")));
  EXPECT_FALSE(fs::exists(path("x.safetensors.tmp")));
}

TEST_F(SafetensorsTest, MissingFileNamesThePath) {
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path("none.safetensors")); }),
              HasSubstr(path("none.safetensors") + ": cannot open"));
}

// ---- broken files ---------------------------------------------------------------------------------

TEST(SafetensorsBroken, HandBuiltValidFileParses) {
  const auto b = st_bytes(R"({"a":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},"__metadata__":{"x":"y"}})", 8);
  SafetensorsFile f(b.data(), b.size(), "ok");
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].nbytes, 8u);
  EXPECT_EQ(f.metadata().at("x"), "y");
}

TEST(SafetensorsBroken, TruncatedLengthAndHeader) {
  EXPECT_THAT(st_error(std::vector<uint8_t>{1, 2, 3}), HasSubstr("truncated: 3 bytes"));
  auto b = st_bytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  b.resize(20);
  EXPECT_THAT(st_error(b), HasSubstr("truncated: header length 53 but only 12 bytes follow"));
}

TEST(SafetensorsBroken, AbsurdHeaderLength) {
  std::vector<uint8_t> b(16, 0);
  const uint64_t n = 1ull << 60;
  std::memcpy(b.data(), &n, 8);
  EXPECT_THAT(st_error(b), HasSubstr("header length 1152921504606846976 exceeds the 100000000-byte limit"));
}

TEST(SafetensorsBroken, NotJsonOrNotAnObject) {
  EXPECT_THAT(st_error("{\"a\": ", 0), HasSubstr("header is not valid JSON"));
  EXPECT_THAT(st_error("[1, 2, 3]", 0), HasSubstr("header JSON is an array, expected an object"));
  EXPECT_THAT(st_error("{\"a\": \"\xff\"}", 0), HasSubstr("header is not valid JSON"));  // invalid UTF-8
}

TEST(SafetensorsBroken, UnknownDtype) {
  EXPECT_THAT(st_error(R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
              HasSubstr("tensor 'w' has unknown dtype 'F8_E4M3'"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1),
              HasSubstr("tensor 'w' dtype is an unsigned integer, expected a string"));
}

TEST(SafetensorsBroken, MissingOrMalformedFields) {
  EXPECT_THAT(st_error(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1), HasSubstr("tensor 'w' has no 'dtype'"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1), HasSubstr("tensor 'w' has no 'shape'"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"U8","shape":[1]}})", 1), HasSubstr("tensor 'w' has no 'data_offsets'"));
  EXPECT_THAT(st_error(R"({"w":[1,2]})", 1), HasSubstr("tensor 'w' entry is an array, expected an object"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
              HasSubstr("tensor 'w' shape[0] is a negative integer, expected a non-negative integer"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1),
              HasSubstr("shape[0] is a non-integer number"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
              HasSubstr("tensor 'w' data_offsets must be [begin, end] of two non-negative integers, found [0]"));
}

TEST(SafetensorsBroken, OffsetsInconsistentWithShape) {
  EXPECT_THAT(st_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8),
              HasSubstr("tensor 'w' data_offsets [0, 4] span 4 bytes, expected 8 for F32 2"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
              HasSubstr("tensor 'w' data_offsets [8, 0] has begin after end"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"U64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
              HasSubstr("tensor 'w': shape 4294967296x4294967296 overflows the element count"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"U64","shape":[4294967296,1073741824],"data_offsets":[0,8]}})", 8),
              HasSubstr("overflows the byte size"));
}

TEST(SafetensorsBroken, DataPastTheBuffer) {
  EXPECT_THAT(st_error(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12),
              HasSubstr("tensor 'w' data_offsets [0, 16] ends past the 12-byte data buffer"));
  EXPECT_THAT(st_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551616]}})", 4),
              HasSubstr("data_offsets must be [begin, end] of two non-negative integers"));  // 2^64 parses as a float
}

TEST(SafetensorsBroken, OverlappingTensors) {
  EXPECT_THAT(st_error(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8),
              HasSubstr("tensor 'b' data [4, 8) overlaps tensor 'a' data [0, 8)"));
}

TEST(SafetensorsBroken, DuplicateNames) {
  EXPECT_THAT(st_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
              HasSubstr("duplicate tensor name 'a'"));
  EXPECT_THAT(st_error(R"({"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", 2),
              HasSubstr("duplicate JSON key 'dtype'"));
}

TEST(SafetensorsBroken, BadMetadata) {
  EXPECT_THAT(st_error(R"({"__metadata__":{"format":3}})", 0),
              HasSubstr("'__metadata__' entry 'format' is an unsigned integer, expected a string"));
  EXPECT_THAT(st_error(R"({"__metadata__":[]})", 0), HasSubstr("'__metadata__' is an array, expected an object"));
}

TEST(SafetensorsBroken, DeepNesting) {
  std::string json = "{\"a\":";
  for (int i = 0; i < 10000; ++i) json += '[';
  EXPECT_THAT(st_error(json, 0), HasSubstr("header JSON is nested deeper than 16 levels"));
}

TEST(SafetensorsBroken, EveryTruncationIsRefusedCleanly) {
  const auto full = st_bytes(
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"U8","shape":[3],"data_offsets":[12,15]}})",
      15);
  { SafetensorsFile ok(full.data(), full.size(), "full"); }
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + long(n));  // exact size: ASan sees overreads
    EXPECT_THAT(st_error(cut), testing::Not(testing::IsEmpty())) << "prefix " << n;
  }
}
