// Helpers shared by the format tests: a fresh directory per test, whole-file reads, and the message of
// the bonsai::Error a call throws.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "util/error.h"

namespace bonsai::testing_support {

// A fresh directory per test (named after the prefix, the pid and the test), removed at the end.
class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(const char* prefix) : prefix_(prefix) {}
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           fmt::format("{}_{}_{}", prefix_, ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;

 private:
  const char* prefix_;
};

inline std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected bonsai::Error, nothing was thrown";
  return {};
}

}  // namespace bonsai::testing_support
