#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include "format/gguf.h"
#include "format_test_util.h"
#include "util/error.h"
#include "util/progress.h"

using namespace bonsai;
using testing::HasSubstr;
using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

class GgufTest : public testing_support::TempDirTest {
 protected:
  GgufTest() : TempDirTest("bonsai_gguf") {}
};

using testing_support::error_of;
using testing_support::read_all;

// The message of parsing `bytes` as "broken.gguf"; every parse error must name the file.
std::string gguf_error(const std::vector<uint8_t>& bytes) {
  std::string msg = error_of([&] { GgufFile f(bytes.data(), bytes.size(), "broken.gguf"); });
  EXPECT_THAT(msg, HasSubstr("broken.gguf"));
  return msg;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);  // [n] u8, distinct per tensor so a wrong offset shows
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 7);
  return v;
}

// Hand-assembles GGUF bytes, including broken ones the writer refuses to produce.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(uint32_t(GgufType::UINT32)).u32(v); }
  Bytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t align = 32) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

// A valid one-tensor file: key "a" = 7, tensor "w" F32 [4] at offset 0.
Bytes valid_small() {
  Bytes g;
  g.header(1, 1).kv_u32("a", 7).tensor("w", {4}, ggml_type::F32, 0).pad().zeros(16);
  return g;
}

void expect_same_value(const GgufValue& a, const GgufValue& b, const std::string& where) {
  ASSERT_EQ(a.type, b.type) << where;
  switch (a.type) {
    case GgufType::UINT8: case GgufType::UINT16: case GgufType::UINT32: case GgufType::UINT64:
      EXPECT_EQ(a.u, b.u) << where; break;
    case GgufType::INT8: case GgufType::INT16: case GgufType::INT32: case GgufType::INT64:
      EXPECT_EQ(a.i, b.i) << where; break;
    case GgufType::FLOAT32: case GgufType::FLOAT64: EXPECT_EQ(a.f, b.f) << where; break;
    case GgufType::BOOL: EXPECT_EQ(a.b, b.b) << where; break;
    case GgufType::STRING: EXPECT_EQ(a.s, b.s) << where; break;
    case GgufType::ARRAY:
      ASSERT_EQ(a.elem_type, b.elem_type) << where;
      ASSERT_EQ(a.arr.size(), b.arr.size()) << where;
      for (size_t k = 0; k < a.arr.size(); ++k) expect_same_value(a.arr[k], b.arr[k], where + "[" + std::to_string(k) + "]");
      break;
  }
}

}  // namespace

// ---- round trips ----------------------------------------------------------------------------------

TEST_F(GgufTest, RoundTripsEveryMetadataValueType) {
  using V = GgufValue;
  std::vector<std::pair<std::string, V>> kvs = {
      {"t.u8", V::u8(250)},
      {"t.i8", V::i8(-120)},
      {"t.u16", V::u16(65000)},
      {"t.i16", V::i16(-32000)},
      {"t.u32", V::u32(4000000000u)},
      {"t.i32", V::i32(-2000000000)},
      {"t.f32", V::f32(1.5e-6f)},
      {"t.bool_true", V::boolean(true)},
      {"t.bool_false", V::boolean(false)},
      {"t.str", V::str("qwen35")},
      {"t.str_empty", V::str("")},
      {"t.str_utf8", V::str("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \0 nul"s)},  // embedded NUL survives
      {"t.u64", V::u64(0xfedcba9876543210ull)},
      {"t.i64", V::i64(std::numeric_limits<int64_t>::min())},
      {"t.f64", V::f64(3.141592653589793)},
      {"t.arr_u8", V::array(GgufType::UINT8, {V::u8(0), V::u8(255)})},
      {"t.arr_i8", V::array(GgufType::INT8, {V::i8(-128), V::i8(127)})},
      {"t.arr_u16", V::array(GgufType::UINT16, {V::u16(1), V::u16(65535)})},
      {"t.arr_i16", V::array(GgufType::INT16, {V::i16(-32768)})},
      {"t.arr_u32", V::arr_u32({5120, 6144, 17408})},
      {"t.arr_i32", V::arr_i32({11, 11, 10, 0})},
      {"t.arr_f32", V::arr_f32({-1.f, 1.f, 0.25f})},
      {"t.arr_bool", V::array(GgufType::BOOL, {V::boolean(true), V::boolean(false)})},
      {"t.arr_str", V::arr_str({"a", "", "\xc4\xa0the", "x y"})},
      {"t.arr_u64", V::array(GgufType::UINT64, {V::u64(~0ull)})},
      {"t.arr_i64", V::array(GgufType::INT64, {V::i64(-1), V::i64(1)})},
      {"t.arr_f64", V::array(GgufType::FLOAT64, {V::f64(-0.5)})},
      {"t.arr_empty", V::array(GgufType::STRING, {})},
      {"t.arr_nested_str", V::array(GgufType::ARRAY, {V::arr_str({"x", "yy"}), V::arr_str({}), V::arr_str({"z"})})},
      {"t.arr_nested2", V::array(GgufType::ARRAY, {V::array(GgufType::ARRAY, {V::arr_i32({1, 2}), V::arr_i32({3})})})},
  };
  GgufWriter w;
  for (const auto& [k, v] : kvs) w.set(k, v);
  w.set("t.u8", V::u8(251));  // replaces in place: order unchanged
  kvs[0].second = V::u8(251);
  w.write(path("kv.gguf"));

  GgufFile f(path("kv.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_FALSE(f.has("general.alignment"));  // the default alignment is not written
  ASSERT_EQ(f.keys().size(), kvs.size());
  for (size_t k = 0; k < kvs.size(); ++k) {
    EXPECT_EQ(f.keys()[k], kvs[k].first);
    const GgufValue* v = f.find(kvs[k].first);
    ASSERT_NE(v, nullptr) << kvs[k].first;
    expect_same_value(*v, kvs[k].second, kvs[k].first);
  }
  EXPECT_EQ(f.tensors().size(), 0u);
  EXPECT_EQ(f.file_size(), w.total_bytes());
}

TEST_F(GgufTest, TypedGettersConvertWhenTheValueFitsAndSayWhyOtherwise) {
  using V = GgufValue;
  GgufWriter w;
  w.set("u8", V::u8(200));
  w.set("neg", V::i32(-5));
  w.set("big", V::u64(1ull << 40));
  w.set("huge", V::u64(~0ull));
  w.set("f64", V::f64(0.5));
  w.set("s", V::str("gpt2"));
  w.set("b", V::boolean(true));
  w.set("tokens", V::arr_str({"a", "b"}));
  w.set("types", V::array(GgufType::UINT8, {V::u8(1), V::u8(3)}));
  w.set("widths", V::arr_u32({5120, 6144}));
  w.set("signs", V::arr_f32({-1.f, 1.f}));
  w.write(path("g.gguf"));
  GgufFile f(path("g.gguf"));

  EXPECT_EQ(f.get_u32("u8"), 200u);
  EXPECT_EQ(f.get_i64("neg"), -5);
  EXPECT_EQ(f.get_u64("big"), 1ull << 40);
  EXPECT_EQ(f.get_f32("f64"), 0.5f);
  EXPECT_EQ(f.get_str("s"), "gpt2");
  EXPECT_TRUE(f.get_bool("b"));
  EXPECT_EQ(f.get_arr_str("tokens"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.get_arr_int("types"), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(f.get_arr_int("widths"), (std::vector<int64_t>{5120, 6144}));
  EXPECT_EQ(f.get_arr_num("signs"), (std::vector<double>{-1.0, 1.0}));
  EXPECT_EQ(f.get_arr_num("widths"), (std::vector<double>{5120, 6144}));
  EXPECT_EQ(f.opt_u32("u8"), 200u);
  EXPECT_EQ(f.opt_u32("absent"), std::nullopt);
  EXPECT_EQ(f.opt_str("absent"), std::nullopt);
  EXPECT_EQ(f.opt_bool("b"), true);
  EXPECT_EQ(f.opt_f32("f64"), 0.5f);

  const std::string p = path("g.gguf");
  EXPECT_THAT(error_of([&] { f.get_u32("absent"); }), HasSubstr(p + ": required key 'absent' is missing"));
  EXPECT_THAT(error_of([&] { f.get_u32("neg"); }), HasSubstr(p + ": key 'neg' value -5 does not fit u32"));
  EXPECT_THAT(error_of([&] { f.get_u32("big"); }), HasSubstr("key 'big' value 1099511627776 does not fit u32"));
  EXPECT_THAT(error_of([&] { f.get_i64("huge"); }), HasSubstr("key 'huge' value 18446744073709551615 does not fit i64"));
  EXPECT_THAT(error_of([&] { f.get_u32("s"); }), HasSubstr("key 's' has type STRING, expected u32"));
  EXPECT_THAT(error_of([&] { f.get_str("u8"); }), HasSubstr("key 'u8' has type UINT8, expected STRING"));
  EXPECT_THAT(error_of([&] { f.get_f32("s"); }), HasSubstr("key 's' has type STRING, expected FLOAT32 or FLOAT64"));
  EXPECT_THAT(error_of([&] { f.get_bool("u8"); }), HasSubstr("key 'u8' has type UINT8, expected BOOL"));
  EXPECT_THAT(error_of([&] { f.get_arr_str("widths"); }),
              HasSubstr("key 'widths' has type ARRAY of UINT32, expected ARRAY of STRING"));
  EXPECT_THAT(error_of([&] { f.get_arr_int("tokens"); }),
              HasSubstr("key 'tokens' has type ARRAY of STRING, expected ARRAY of integers"));
  EXPECT_THAT(error_of([&] { f.get_arr_num("s"); }), HasSubstr("key 's' has type STRING, expected ARRAY of numbers"));
  EXPECT_THAT(error_of([&] { f.opt_u32("s"); }), HasSubstr("key 's' has type STRING"));  // present, wrong type
}

TEST_F(GgufTest, TensorBytesOffsetsAndPaddingRoundTrip) {
  struct T {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    uint64_t nbytes;
  };
  const std::vector<T> ts = {
      {"norm.weight", ggml_type::F32, {3}, 12},
      {"w.pq2", ggml_type::PQ2_0, {256, 3}, 2 * 34 * 3},
      {"w.ptq1", ggml_type::PTQ1_0, {128, 2, 2}, 28 * 4},
      {"alpha.weight", ggml_type::BF16, {5, 2}, 20},
      {"q8", ggml_type::Q8_0, {64}, 68},
      {"i64", ggml_type::I64, {2, 1, 1, 3}, 48},
  };
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("qwen35"));
  std::vector<std::vector<uint8_t>> data;
  for (size_t k = 0; k < ts.size(); ++k) {
    data.push_back(pattern(ts[k].nbytes, uint8_t(k * 31 + 1)));
    EXPECT_EQ(ggml_tensor_bytes(ts[k].type, ts[k].ne, ts[k].name), ts[k].nbytes);
    w.add_tensor(ts[k].name, ts[k].type, ts[k].ne, data.back());
  }
  w.write(path("t.gguf"));
  const auto raw = read_all(path("t.gguf"));
  EXPECT_EQ(raw.size(), w.total_bytes());

  GgufFile f(path("t.gguf"));
  ASSERT_EQ(f.tensors().size(), ts.size());
  EXPECT_EQ(f.data_offset() % 32, 0u);
  uint64_t expect_offset = 0;
  for (size_t k = 0; k < ts.size(); ++k) {
    const GgufTensorInfo& ti = f.tensors()[k];
    EXPECT_EQ(ti.name, ts[k].name);
    EXPECT_EQ(ti.type, ts[k].type);
    EXPECT_EQ(ti.ne, ts[k].ne);
    EXPECT_EQ(ti.nbytes, ts[k].nbytes);
    EXPECT_EQ(ti.offset, expect_offset) << ti.name;
    EXPECT_EQ(ti.data, f.file_data() + f.data_offset() + ti.offset);
    EXPECT_EQ(std::vector<uint8_t>(ti.data, ti.data + ti.nbytes), data[k]) << ti.name;
    // Padding between tensors is zeros.
    const uint64_t padded = (ti.nbytes + 31) / 32 * 32;
    for (uint64_t p = ti.nbytes; p < padded; ++p) EXPECT_EQ(ti.data[p], 0) << ti.name << " pad " << p;
    expect_offset += padded;
    EXPECT_EQ(f.find_tensor(ts[k].name), &ti);
  }
  EXPECT_EQ(f.tensors()[2].elements(), 512u);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
  EXPECT_EQ(raw.size(), f.data_offset() + expect_offset);

  // The memory constructor sees exactly what the mapping sees.
  GgufFile m(raw.data(), raw.size(), "mem");
  EXPECT_EQ(m.path(), "mem");
  EXPECT_EQ(m.mapping(), nullptr);
  ASSERT_EQ(m.tensors().size(), ts.size());
  for (size_t k = 0; k < ts.size(); ++k) EXPECT_EQ(m.tensors()[k].data, raw.data() + (f.tensors()[k].data - f.file_data()));
}

TEST_F(GgufTest, NonDefaultAlignmentIsWrittenAndHonoured) {
  for (uint32_t align : {1u, 8u, 64u, 4096u}) {
    GgufWriter w;
    w.set_alignment(align);
    w.add_tensor("a", ggml_type::F32, {3}, pattern(12, 1));
    w.add_tensor("b", ggml_type::F16, {5}, pattern(10, 2));
    w.add_tensor("c", ggml_type::PQ2_0, {128}, pattern(34, 3));
    const std::string p = path(fmt::format("align{}.gguf", align));
    w.write(p);
    GgufFile f(p);
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.get_u32("general.alignment"), align);
    EXPECT_EQ(f.find("general.alignment")->type, GgufType::UINT32);
    EXPECT_EQ(f.data_offset() % align, 0u);
    for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % align, 0u) << align << " " << t.name;
    EXPECT_EQ(f.tensors()[1].offset, (12 + align - 1) / align * align);
    EXPECT_EQ(std::vector<uint8_t>(f.tensors()[2].data, f.tensors()[2].data + 34), pattern(34, 3));
    EXPECT_EQ(f.file_size(), w.total_bytes());
  }
  // Going back to the default removes the key again.
  GgufWriter w;
  w.set_alignment(64);
  w.set_alignment(32);
  w.write(path("default.gguf"));
  EXPECT_FALSE(GgufFile(path("default.gguf")).has("general.alignment"));
}

TEST_F(GgufTest, FillCallbacksProduceTheSameFileAsByteVectors) {
  const auto a = pattern(34 * 4 * 3, 5), b = pattern(28 * 2, 9), c = pattern(40, 77);
  auto build = [&](bool use_fill) {
    GgufWriter w;
    w.set("general.architecture", GgufValue::str("qwen35"));
    w.set_alignment(64);
    auto add = [&](const std::string& name, uint32_t type, std::vector<uint64_t> ne, const std::vector<uint8_t>& bytes) {
      if (use_fill) {
        w.add_tensor(name, type, ne, [&bytes](uint8_t* dst, uint64_t n) {
          ASSERT_EQ(n, bytes.size());
          std::memcpy(dst, bytes.data(), n);
        });
      } else {
        w.add_tensor(name, type, ne, bytes);
      }
    };
    add("small.first", ggml_type::F32, {10}, c);  // small then large then small: the scratch buffer grows
    add("big", ggml_type::PQ2_0, {512, 3}, a);
    add("mid", ggml_type::PTQ1_0, {256}, b);
    return w;
  };
  Progress progress("test", build(true).total_bytes(), false);
  build(true).write(path("fill.gguf"), &progress);
  build(false).write(path("bytes.gguf"));
  const auto x = read_all(path("fill.gguf")), y = read_all(path("bytes.gguf"));
  EXPECT_EQ(x.size(), build(false).total_bytes());
  EXPECT_EQ(x, y);
}

TEST_F(GgufTest, FailedWriteLeavesNoFileBehind) {
  GgufWriter w;
  w.add_tensor("ok", ggml_type::F32, {4}, pattern(16, 1));
  w.add_tensor("boom", ggml_type::F32, {4}, [](uint8_t*, uint64_t) { throw Error("fill failed"); });
  EXPECT_THAT(error_of([&] { w.write(path("x.gguf")); }), HasSubstr("fill failed"));
  EXPECT_FALSE(fs::exists(path("x.gguf")));
  EXPECT_FALSE(fs::exists(path("x.gguf.tmp")));
  // An unwritable destination names the temporary path.
  EXPECT_THAT(error_of([&] { GgufWriter().write(path("no/such/dir/y.gguf")); }),
              HasSubstr("no/such/dir/y.gguf.tmp: cannot create"));
}

TEST_F(GgufTest, WriterRefusesWhatItCannotWriteFaithfully) {
  GgufWriter w;
  EXPECT_THAT(error_of([&] { w.add_tensor("t", ggml_type::F32, {4}, std::vector<uint8_t>(15)); }),
              HasSubstr("tensor 't': has 15 bytes, expected 16"));
  EXPECT_THAT(error_of([&] { w.add_tensor("t", ggml_type::PQ2_0, {100}, std::vector<uint8_t>(34)); }),
              HasSubstr("row length ne[0] = 100 is not a multiple of the PQ2_0 block size 128"));
  EXPECT_THAT(error_of([&] { w.add_tensor("t", 77, {4}, std::vector<uint8_t>(16)); }),
              HasSubstr("tensor 't': unknown ggml type id 77"));
  EXPECT_THAT(error_of([&] { w.add_tensor("t", ggml_type::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)); }),
              HasSubstr("has 5 dimensions, expected 1..4"));
  w.add_tensor("t", ggml_type::F32, {4}, std::vector<uint8_t>(16));
  EXPECT_THAT(error_of([&] { w.add_tensor("t", ggml_type::F32, {4}, std::vector<uint8_t>(16)); }),
              HasSubstr("duplicate tensor name 't'"));
  EXPECT_THAT(error_of([&] { w.set_alignment(48); }), HasSubstr("power of two in 1..65536, got 48"));
  EXPECT_THAT(error_of([&] { w.set("general.alignment", GgufValue::u64(64)); }), HasSubstr("UINT32"));

  GgufWriter bad_array;
  bad_array.set("k", GgufValue::array(GgufType::INT32, {GgufValue::i32(1), GgufValue::u32(2)}));
  EXPECT_THAT(error_of([&] { bad_array.write(path("a.gguf")); }),
              HasSubstr("key 'k': array element 1 is UINT32, expected INT32"));
  GgufWriter bad_range;
  GgufValue v = GgufValue::u8(0);
  v.u = 300;
  bad_range.set("k", v);
  EXPECT_THAT(error_of([&] { bad_range.write(path("b.gguf")); }), HasSubstr("key 'k': value 300 does not fit UINT8"));
  EXPECT_FALSE(fs::exists(path("a.gguf")));
}

TEST_F(GgufTest, Version2IsAccepted) {
  Bytes g = valid_small();
  g.b[4] = 2;
  GgufFile f(g.b.data(), g.b.size(), "v2.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_u32("a"), 7u);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].nbytes, 16u);
}

TEST_F(GgufTest, MissingFileNamesThePath) {
  EXPECT_THAT(error_of([&] { GgufFile f(path("missing.gguf")); }), HasSubstr(path("missing.gguf") + ": cannot open"));
}

// ---- broken files ---------------------------------------------------------------------------------

TEST(GgufBroken, HandBuiltValidFileParses) {
  // The baseline the broken variants below are derived from must itself be accepted.
  Bytes g = valid_small();
  GgufFile f(g.b.data(), g.b.size(), "ok.gguf");
  EXPECT_EQ(f.get_u32("a"), 7u);
  EXPECT_EQ(f.data_offset(), 96u);  // 24 header + 17 kv + 33 tensor info = 74, padded to 32
}

TEST(GgufBroken, TruncatedHeader) {
  Bytes g = valid_small();
  g.b.resize(10);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("shorter than the 24-byte GGUF header"));
  EXPECT_THAT(gguf_error({}), HasSubstr("0 bytes is shorter than the 24-byte GGUF header"));
}

TEST(GgufBroken, BadMagic) {
  Bytes g = valid_small();
  g.b[0] = 'X';
  EXPECT_THAT(gguf_error(g.b), HasSubstr("bad magic 58 47 55 46, expected 'GGUF'"));
}

TEST(GgufBroken, WrongVersion) {
  Bytes g = valid_small();
  g.b[4] = 4;
  EXPECT_THAT(gguf_error(g.b), HasSubstr("unsupported GGUF version 4, expected 3"));
  g.b[4] = 1;
  EXPECT_THAT(gguf_error(g.b), HasSubstr("GGUF version 1 is not supported"));
  g.b[4] = 0;
  g.b[7] = 3;  // 0x03000000: a big-endian version 3
  EXPECT_THAT(gguf_error(g.b), HasSubstr("big-endian GGUF (version 3) is not supported"));
}

TEST(GgufBroken, AbsurdCounts) {
  Bytes g;
  g.header(1ull << 60, 0).zeros(64);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("header claims 1152921504606846976 tensors, but the 64 bytes left"));
  Bytes k;
  k.header(0, 1ull << 60).zeros(64);
  EXPECT_THAT(gguf_error(k.b), HasSubstr("header claims 1152921504606846976 metadata entries"));
}

TEST(GgufBroken, CountsThatFitTheFileButNotMemoryLimits) {
  // Internally consistent headers whose entries are too many to hold: refused before they are built.
  Bytes t;
  t.header((1ull << 20) + 1, 0).zeros(33 * ((1ull << 20) + 1));
  EXPECT_THAT(gguf_error(t.b), HasSubstr("header claims 1048577 tensors, more than the 1048576 this reader accepts"));
  Bytes a;
  const uint64_t n = (1ull << 24) + 1;
  a.header(0, 1).str("big").u32(uint32_t(GgufType::ARRAY)).u32(uint32_t(GgufType::UINT8)).u64(n).zeros(n);
  EXPECT_THAT(gguf_error(a.b), HasSubstr("key 'big': array of 16777217 elements would take the metadata past 16777216 values"));
}

TEST(GgufBroken, AbsurdStringLength) {
  Bytes g;
  g.header(0, 1).u64(1ull << 60).zeros(32);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("key of metadata entry #0 at offset 24 claims a string of 1152921504606846976 bytes"));
  Bytes v;
  v.header(0, 1).str("name").u32(uint32_t(GgufType::STRING)).u64(~0ull);
  EXPECT_THAT(gguf_error(v.b), HasSubstr("value of key 'name' at offset 40 claims a string of 18446744073709551615 bytes"));
  Bytes t;
  t.header(1, 0).u64(1ull << 60).zeros(40);
  EXPECT_THAT(gguf_error(t.b), HasSubstr("name of tensor #0 at offset 24 claims a string"));
}

TEST(GgufBroken, AbsurdArrayLength) {
  Bytes g;
  g.header(0, 1).str("tokens").u32(uint32_t(GgufType::ARRAY)).u32(uint32_t(GgufType::STRING)).u64(1ull << 61).zeros(64);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("key 'tokens': array of 2305843009213693952 STRING elements needs at least 8 bytes each"));
  Bytes u;
  u.header(0, 1).str("x").u32(uint32_t(GgufType::ARRAY)).u32(uint32_t(GgufType::UINT32)).u64(17).zeros(64);
  EXPECT_THAT(gguf_error(u.b), HasSubstr("array of 17 UINT32 elements needs at least 4 bytes each, but only 64 bytes"));
}

TEST(GgufBroken, TruncatedValue) {
  Bytes g;
  g.header(0, 1).str("eps").u32(uint32_t(GgufType::FLOAT64)).u32(0);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("truncated: value of key 'eps' at offset 39 needs 8 bytes, only 4 left"));
}

TEST(GgufBroken, UnknownValueTypes) {
  Bytes g;
  g.header(0, 1).str("k").u32(13).u32(0);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("key 'k' has unknown value type id 13"));
  Bytes a;
  a.header(0, 1).str("k").u32(uint32_t(GgufType::ARRAY)).u32(99).u64(0);
  EXPECT_THAT(gguf_error(a.b), HasSubstr("key 'k': unknown array element type id 99"));
}

TEST(GgufBroken, BoolOtherThanZeroOrOne) {
  Bytes g;
  g.header(0, 1).str("flag").u32(uint32_t(GgufType::BOOL)).u8(2);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("key 'flag': bool value must be 0 or 1, found 2"));
}

TEST(GgufBroken, DeeplyNestedArrays) {
  Bytes g;
  g.header(0, 1).str("deep").u32(uint32_t(GgufType::ARRAY));
  for (int d = 0; d < 20; ++d) g.u32(uint32_t(GgufType::ARRAY)).u64(1);
  g.u32(uint32_t(GgufType::UINT8)).u64(0);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("key 'deep': arrays nested deeper than 8 levels"));
}

TEST(GgufBroken, DuplicateKey) {
  Bytes g;
  g.header(0, 2).kv_u32("a", 1).kv_u32("a", 2);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("duplicate metadata key 'a'"));
}

TEST(GgufBroken, EmptyKeyAndEmptyTensorName) {
  Bytes g;
  g.header(0, 1).kv_u32("", 1);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("metadata entry #0 has an empty key"));
  Bytes t;
  t.header(1, 0).tensor("", {4}, ggml_type::F32, 0).pad().zeros(16);
  EXPECT_THAT(gguf_error(t.b), HasSubstr("tensor #0 has an empty name"));
}

TEST(GgufBroken, BadAlignmentValue) {
  Bytes g;
  g.header(0, 1).kv_u32("general.alignment", 48);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("key 'general.alignment' must be a power of two in 1..65536, found 48"));
  Bytes z;
  z.header(0, 1).kv_u32("general.alignment", 0);
  EXPECT_THAT(gguf_error(z.b), HasSubstr("power of two in 1..65536, found 0"));
  // Found by fuzzing: a huge power of two made a writer re-serialising the file allocate 2 GB of padding.
  Bytes h;
  h.header(0, 1).kv_u32("general.alignment", 1u << 31);
  EXPECT_THAT(gguf_error(h.b), HasSubstr("power of two in 1..65536, found 2147483648"));
  Bytes t;
  t.header(0, 1).str("general.alignment").u32(uint32_t(GgufType::UINT64)).u64(32);
  EXPECT_THAT(gguf_error(t.b), HasSubstr("key 'general.alignment' has type UINT64, expected UINT32"));
}

TEST(GgufBroken, BadDims) {
  Bytes g;
  g.header(1, 0).tensor("w", {}, ggml_type::F32, 0).pad().zeros(16);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("tensor 'w' has n_dims 0, expected 1..4"));
  Bytes f;
  f.header(1, 0).tensor("w", {1, 1, 1, 1, 1}, ggml_type::F32, 0).pad().zeros(16);
  EXPECT_THAT(gguf_error(f.b), HasSubstr("tensor 'w' has n_dims 5, expected 1..4"));
}

TEST(GgufBroken, ElementCountOverflow) {
  Bytes g;
  g.header(1, 0).tensor("w", {1ull << 32, 1ull << 32}, ggml_type::F32, 0).pad().zeros(16);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("tensor 'w': element count overflows (ne[1] = 4294967296)"));
  Bytes b;  // elements fit, bytes (x8) do not
  b.header(1, 0).tensor("w", {1ull << 31, 1ull << 31}, ggml_type::F64, 0).pad().zeros(16);
  EXPECT_THAT(gguf_error(b.b), HasSubstr("tensor 'w': byte size overflows"));
}

TEST(GgufBroken, UnknownGgmlType) {
  Bytes g;
  g.header(1, 0).tensor("blk.0.ffn_up.weight", {128}, 99, 0).pad().zeros(64);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("tensor 'blk.0.ffn_up.weight' has unknown or unsupported ggml type id 99"));
}

TEST(GgufBroken, RowLengthNotAMultipleOfTheBlock) {
  Bytes g;
  g.header(1, 0).tensor("w", {100, 2}, ggml_type::PTQ1_0, 0).pad().zeros(64);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("tensor 'w': row length ne[0] = 100 is not a multiple of the PTQ1_0 block size 128"));
}

TEST(GgufBroken, MisalignedOffset) {
  Bytes g;
  g.header(1, 0).tensor("w", {4}, ggml_type::F32, 4).pad().zeros(64);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("tensor 'w' data offset 4 is not a multiple of the alignment 32"));
}

TEST(GgufBroken, DataPastEndOfFile) {
  Bytes g;
  g.header(1, 0).tensor("w", {4}, ggml_type::F32, 0).pad().zeros(15);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("tensor 'w' data [0, 16) relative to the data section (file offset 64) ends past "
                                         "the end of the file: the data section holds 15 bytes"));
  Bytes far;
  far.header(1, 0).tensor("w", {4}, ggml_type::F32, ~0ull << 5).pad().zeros(16);
  EXPECT_THAT(gguf_error(far.b), HasSubstr("ends past the end of the file"));
  Bytes nodata;  // tensor infos end right at EOF, unpadded
  nodata.header(1, 0).tensor("w", {4}, ggml_type::F32, 0);
  EXPECT_THAT(gguf_error(nodata.b), HasSubstr("data section would start at offset 64 (alignment 32), past the end of the 57-byte file"));
}

TEST(GgufBroken, DuplicateTensorName) {
  Bytes g;
  g.header(2, 0).tensor("w", {4}, ggml_type::F32, 0).tensor("w", {4}, ggml_type::F32, 32).pad().zeros(64);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("duplicate tensor name 'w'"));
}

TEST(GgufBroken, OverlappingTensors) {
  Bytes g;
  g.header(2, 0).tensor("a", {16}, ggml_type::F32, 0).tensor("b", {4}, ggml_type::F32, 32).pad().zeros(64);
  EXPECT_THAT(gguf_error(g.b), HasSubstr("tensor 'b' data [32, 48) overlaps tensor 'a' data [0, 64)"));
}

TEST(GgufBroken, EveryTruncationOfAValidFileIsRefusedCleanly) {
  // A real writer file with every value kind; each strict prefix must give an Error, never a crash.
  GgufWriter w;
  w.set("s", GgufValue::str("hello"));
  w.set("n", GgufValue::array(GgufType::ARRAY, {GgufValue::arr_str({"a", "bc"})}));
  w.set("f", GgufValue::f32(2.f));
  w.set_alignment(16);
  w.add_tensor("w", ggml_type::PQ2_0, {128, 2}, pattern(68, 4));
  w.add_tensor("n", ggml_type::F32, {3}, pattern(12, 8));
  const std::string p = (fs::path(testing::TempDir()) / fmt::format("bonsai_trunc_{}.gguf", ::getpid())).string();
  w.write(p);
  const auto full = read_all(p);
  fs::remove(p);
  { GgufFile ok(full.data(), full.size(), "full"); }
  // The last tensor's trailing padding (12 -> 16) is not needed by the reader, so prefixes that only cut
  // padding are valid; everything shorter must throw.
  for (size_t n = 0; n + 4 < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + long(n));  // exact-size copy: ASan sees overreads
    EXPECT_THAT(gguf_error(cut), testing::Not(testing::IsEmpty())) << "prefix " << n;
  }
}
