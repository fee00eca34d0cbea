#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "format/mapped_file.h"
#include "format_test_util.h"
#include "util/error.h"

using namespace bonsai;
using testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

class MappedFileTest : public testing_support::TempDirTest {
 protected:
  MappedFileTest() : TempDirTest("bonsai_map") {}
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
};

using testing_support::error_of;

}  // namespace

TEST_F(MappedFileTest, MapsTheBytes) {
  const std::string p = write("a.bin", "hello, mapping");
  MappedFile m(p);
  EXPECT_EQ(m.path(), p);
  ASSERT_EQ(m.size(), 14u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), "hello, mapping");
}

TEST_F(MappedFileTest, EmptyFileIsAnEmptyMapping) {
  MappedFile m(write("empty.bin", ""));
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.data(), nullptr);
  m.advise_sequential(0, 100);  // hints on an empty mapping are no-ops
  m.release(0, 100);
}

TEST_F(MappedFileTest, MissingFileAndDirectoryNameThePath) {
  const std::string missing = (dir_ / "nope.bin").string();
  EXPECT_THAT(error_of([&] { MappedFile m(missing); }), HasSubstr(missing + ": cannot open: No such file"));
  EXPECT_THAT(error_of([&] { MappedFile m(dir_.string()); }), HasSubstr(dir_.string() + ": not a regular file"));
}

TEST_F(MappedFileTest, MoveTransfersOwnership) {
  MappedFile a(write("a.bin", "abc"));
  const uint8_t* p = a.data();
  MappedFile b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(a.size(), 0u);
  MappedFile c(write("c.bin", "defg"));
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.data()[2], 'c');
  MappedFile d;
  EXPECT_EQ(d.data(), nullptr);
  EXPECT_EQ(d.size(), 0u);
}

TEST_F(MappedFileTest, ReleasedPagesReadBackFromTheFile) {
  std::string bytes(3 * 1000 * 1000 + 17, '\0');  // several pages and a partial last page
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 131 + 7);
  MappedFile m(write("big.bin", bytes));
  m.advise_sequential(0, m.size());
  m.advise_sequential(12345, ~0ull);  // clamped to the file
  m.advise_sequential(m.size() + 5, 10);
  m.release(1, m.size());
  m.release(4096 * 3 + 1, 10);  // smaller than a page after shrinking inward: no-op
  m.release(m.size() + 1, 1);
  ASSERT_EQ(m.size(), bytes.size());
  EXPECT_EQ(std::memcmp(m.data(), bytes.data(), bytes.size()), 0);
}
