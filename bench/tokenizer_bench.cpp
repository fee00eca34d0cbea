// Encode throughput of the tokenizer on one thread, on the real Qwen3.5 vocabulary (test fixture) and the
// same mixed text the HF comparison uses (tools/fixtures/gen_tokenizer_fixtures.py --bench): every text of
// tests/data/tokenizer/corpus.jsonl joined by "\n", repeated to ~8 MB, encoded line by line with special
// tokens not parsed.
//
//   build-tok/bench/bench_tokenizer_bench [--benchmark_min_time=2]
//   python3 tools/fixtures/gen_tokenizer_fixtures.py --bench          # HF tokenizers, one thread
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/bpe_trainer.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "tokenizer/tokenizer.h"

#ifndef BONSAI_SOURCE_DIR_BENCH
#define BONSAI_SOURCE_DIR_BENCH "."
#endif

namespace {

std::string data_dir() {
  if (const char* d = std::getenv("BONSAI_TOKENIZER_DATA")) return d;
  return std::string(BONSAI_SOURCE_DIR_BENCH) + "/tests/data/tokenizer";
}

std::string gunzip(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(("gzip -dc '" + path + "'").c_str(), "r"), pclose);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  return out;
}

struct Setup {
  std::unique_ptr<bonsai::Tokenizer> qwen, tiny;
  std::vector<std::string> lines;
  size_t bytes = 0;
  Setup() {
    const std::string dir = data_dir();
    const std::string tj = gunzip(dir + "/qwen35_tokenizer.json.gz");
    if (tj.empty()) {
      std::fprintf(stderr, "cannot read %s/qwen35_tokenizer.json.gz (run from the repo root or set BONSAI_TOKENIZER_DATA)\n",
                   dir.c_str());
      std::exit(1);
    }
    qwen = std::make_unique<bonsai::Tokenizer>(bonsai::vocabulary_from_tokenizer_json_text(tj, "qwen35_tokenizer.json"));
    tiny = std::make_unique<bonsai::Tokenizer>(bonsai::tiny_vocabulary());
    std::ifstream f(dir + "/corpus.jsonl");
    std::string line, one;
    bool first = true;
    while (std::getline(f, line)) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("text")) continue;
      if (!first) one += "\n";
      one += j["text"].get<std::string>();
      first = false;
    }
    const size_t reps = std::max<size_t>(1, static_cast<size_t>(8e6 / static_cast<double>(one.size())));
    std::string all;
    for (size_t r = 0; r < reps; ++r) {
      if (r) all += "\n";
      all += one;
    }
    bytes = all.size();
    size_t s = 0;
    for (;;) {  // split on '\n' exactly like Python's str.split("\n")
      const size_t e = all.find('\n', s);
      lines.push_back(all.substr(s, e == std::string::npos ? std::string::npos : e - s));
      if (e == std::string::npos) break;
      s = e + 1;
    }
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

void run(benchmark::State& state, const bonsai::Tokenizer& tok) {
  const Setup& s = setup();
  std::vector<int32_t> ids;
  size_t n_tokens = 0;
  for (auto _ : state) {
    n_tokens = 0;
    for (const auto& l : s.lines) {
      ids.clear();
      tok.encode(l, false, ids);
      n_tokens += ids.size();
    }
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.bytes));
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(s.bytes) / 1e6, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = static_cast<double>(n_tokens);
}

void BM_EncodeQwen35(benchmark::State& state) { run(state, *setup().qwen); }
void BM_EncodeTiny(benchmark::State& state) { run(state, *setup().tiny); }

// A cold cache each iteration: the cost of words never seen before (worst case for long inputs).
void BM_EncodeQwen35Cold(benchmark::State& state) {
  const Setup& s = setup();
  std::vector<int32_t> ids;
  size_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    bonsai::Tokenizer tok(s.qwen->vocab());  // fresh tables and an empty cache
    state.ResumeTiming();
    bytes = 0;
    for (size_t i = 0; i < s.lines.size() / 8; ++i) {  // the first copy of the corpus only
      ids.clear();
      tok.encode(s.lines[i], false, ids);
      bytes += s.lines[i].size() + 1;
    }
  }
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(bytes) / 1e6, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Decode(benchmark::State& state) {
  const Setup& s = setup();
  std::vector<int32_t> ids;
  for (const auto& l : s.lines) s.qwen->encode(l, false, ids);
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string out = s.qwen->decode(ids);
    bytes = out.size();
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(bytes) / 1e6, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_EncodeQwen35)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeQwen35Cold)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_EncodeTiny)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
