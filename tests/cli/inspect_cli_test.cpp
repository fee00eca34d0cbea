// `bonsai inspect` through the real binary: the JSON report of a good pack and the exit code of a bad one.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../model/tiny_packs.h"

using bonsai::testing_support::tiny_packs;

namespace {

struct CliRun {
  int code;
  std::string out;
};

CliRun run_bonsai(const std::string& args) {
  const std::string cmd = std::string(BONSAI_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST(InspectCli, ReportsATinyPackAsValid) {
  for (const std::string& pack : {tiny_packs().pq2, tiny_packs().ptq1, tiny_packs().mlx}) {
    const CliRun r = run_bonsai("inspect --json " + pack);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j["valid"].get<bool>());
    EXPECT_EQ(j["architecture"], "qwen35");
    EXPECT_EQ(j["layers"]["pattern"], "GGGA");
    EXPECT_EQ(j["hyperparameters"]["embedding_length"], 1024);
    EXPECT_EQ(j["hadamard"]["block_size"], 1024);
    EXPECT_EQ(j["hadamard"]["inverse"], 1);
    // Every ternary matrix but the embedding is folded: 3 GDN layers x 6 + 1 attention layer x 7 + head.
    EXPECT_EQ(j["hadamard"]["folded"], 3 * 6 + 7 + 1);
    EXPECT_TRUE(j["tokenizer"]["present"].get<bool>());
    EXPECT_EQ(j["tokenizer"]["pre"], "qwen35");
    EXPECT_LT(j["bytes_per_token"].get<uint64_t>(), j["tensors"]["bytes"].get<uint64_t>());
  }
}

TEST(InspectCli, LoadReportsTimeAndRss) {
  const CliRun r = run_bonsai("inspect --json --load " + tiny_packs().pq2);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["load"]["seconds"].get<double>(), 0.0);
  EXPECT_GT(j["load"]["peak_rss_bytes"].get<uint64_t>(), 0u);
}

TEST(InspectCli, InvalidPackExitsTwoAndListsProblems) {
  // A GGUF whose Hadamard version is wrong: patch the u32 right after the key.
  std::ifstream in(tiny_packs().pq2, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "prism.hadamard.version";
  const size_t at = b.find(key) + key.size() + 4;  // value type u32, then the value
  b[at] = 9;
  const std::string path = tiny_packs().dir + "/inspect_bad_version.gguf";
  std::ofstream(path, std::ios::binary) << b;
  const CliRun r = run_bonsai("inspect " + path);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("valid: false"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prism.hadamard.version is 9, expected 1"), std::string::npos) << r.out;
}

TEST(InspectCli, MissingFileIsAClearError) {
  const CliRun r = run_bonsai("inspect /nonexistent/pack.gguf");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/pack.gguf: no such file or folder"), std::string::npos) << r.out;
}
