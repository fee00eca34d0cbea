// CPU kernel benchmarks at the real 27B shapes, for every kernel variant this CPU runs, on 1 and 2
// threads, through the op entry points (cpu::ternary_matmul: activation quantisation and threading
// included, as the model will call them).
//
//   matvec/<act>/<variant>/K<K>_N<N>/t<threads>    decode, M = 1
//   gemm64/<act>/<variant>/K<K>_N<N>/t<threads>    prefill chunk, M = 64
//   read/K<K>_N<N>/t<threads>                      the same bytes read and discarded, same pool and chunks
//   incache/<act>/<variant>/...                   the kernel alone on an L2-resident matrix (compute ceiling)
//   matvec_tiled/, gemm64_tiled/, incache_tiled/  the same on the tiled layout (backend/cpu/tiles.h), where
//                                                 the variant has tiled kernels (integer activations only)
//   fwht/<variant>/...  quantize_q8/L<digits>/<variant>/...  dot/<variant>/...
// act: q8 / q16 / q24 (activation as 1 / 2 / 3 int8 digits per element, VNNI where present) or f32
// (fp32 activations, exact).
//
// Counters: GB/s = ternary weight bytes (2-bit codes + fp16 scales = 2.125 bits/weight) / wall time;
// of_probe = GB/s / the streaming-read probe at the same thread count (probe.h), measured at start and
// printed first (stderr); GB/s/core = weight bytes / CPU seconds of all threads (what a core streams while
// it runs: the wall rate on a machine shared with other work reflects the CPU share we got); GMAC/s for
// the GEMM. Several copies of each matrix (>= 256 MiB in all, 8x the L3) are
// used in turn so that no iteration finds its weights in cache.
//
// Run: build-simd/bench/bench_cpu_kernels [--benchmark_filter=matvec/q8] [--benchmark_min_time=0.5]
//      BONSAI_BENCH_SHAPES=all|small (small: only K5120_N1024 and K6144_N5120; default all)
#include <benchmark/benchmark.h>

#include <atomic>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/act_q8.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/probe.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/tiles.h"
#include "util/large_buffer.h"
#include "format/ternary_codec.h"
#include "util/half.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace cpu = bonsai::cpu;

namespace {

struct Shape {
  int64_t K, N;
};
// 27B: K=5120 rows of 17408 / 10240 / 6144 / 12288 / 1024; K=6144 -> 5120; K=17408 -> 5120; the head.
const Shape kShapes[] = {{5120, 17408}, {5120, 10240}, {5120, 6144}, {5120, 12288}, {5120, 1024},
                         {6144, 5120},  {17408, 5120}, {5120, 248320}};
const char* const kVariants[] = {"avx512vnni", "avx512bw", "avx2", "portable"};

double weight_bytes(const Shape& s) { return double(s.N) * double(s.K) * (2.0 / 8.0 + 2.0 / 128.0); }

// Random canonical weights (codes 0..2, scales ~0.01): speed does not depend on the values.
struct Matrix {
  std::vector<uint32_t> words;   // [N, K/16]   split form, filled first, freed by encode()
  std::vector<uint16_t> scales;  // [N, K/128]
  // In 2 MiB pages (LargeVector), as the runtime holds them (the mapped pack, the tiles): in 4 KiB pages a
  // 2-thread stream loses ~30% to TLB walks on this class of VM.
  bonsai::LargeVector<uint8_t> blocks;   // [N, K/128, 34] PQ2_0 blocks (the canonical layout the kernels read)
  cpu::TiledCopy tiled;           // the same in the CPU's tiled layout (backend/cpu/tiles.h), built on demand
  void tile(int64_t N, int64_t K) {
    if (!tiled.tiles) tiled = cpu::make_tiled_copy(blocks.data(), nullptr, 0, N, K);
  }
  void encode(int64_t N, int64_t K) {
    blocks.resize(size_t(N * K / 128 * bonsai::kPq2Bytes));
    bonsai::canonical_to_pq2(words.data(), scales.data(), uint64_t(N), uint64_t(K), blocks.data());
    words = {};  // only the blocks stay resident
    scales = {};
  }
};
struct Copies {
  Shape shape{0, 0};
  std::vector<Matrix> m;
};
Copies& weights(const Shape& s) {
  static Copies c;
  if (c.shape.K == s.K && c.shape.N == s.N) return c;
  c.m.clear();  // one shape resident at a time
  c.shape = s;
  const double bytes = weight_bytes(s);
  const int copies = std::max(1, int(std::ceil(double(256 << 20) / bytes)));
  uint64_t state = 0x9e3779b97f4a7c15ull ^ uint64_t(s.K * 131 + s.N);
  auto next = [&] {  // xorshift64
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int i = 0; i < copies; ++i) {
    Matrix m{std::vector<uint32_t>(size_t(s.N * s.K / 16)), std::vector<uint16_t>(size_t(s.N * s.K / 128)), {}};
    for (auto& w : m.words) {
      // 16 codes from 32 random bits, each mapped into {0, 1, 2}.
      uint64_t r = next();
      uint32_t v = 0;
      for (int j = 0; j < 16; ++j, r >>= 4) v |= uint32_t((r & 15) % 3) << (2 * j);
      w = v;
    }
    for (auto& d : m.scales) d = bonsai::f32_to_fp16(0.005f + float(next() % 1000) * 1e-5f);
    m.encode(s.N, s.K);
    c.m.push_back(std::move(m));
  }
  return c;
}

std::vector<float> activation(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

std::map<int, double> g_probe_gbs;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}  // threads -> streaming read GB/s

void setup(benchmark::State& state, const char* variant, int threads) {
  if (!cpu::set_kernels(variant)) {
    state.SkipWithError("this CPU cannot run this variant");
    return;
  }
  cpu::set_num_threads(threads);
}

void bm_ternary(benchmark::State& state, const char* variant, cpu::TernaryActivation act, Shape s, int64_t M,
                int threads, bool tiled = false) {
  setup(state, variant, threads);
  if (state.error_occurred()) return;
  cpu::set_ternary_activation(act);
  Copies& w = weights(s);
  if (tiled)
    for (Matrix& m : w.m) m.tile(s.N, s.K);
  const auto x = activation(M * s.K, 1);
  std::vector<float> y(size_t(M * s.N));
  size_t i = 0;
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const Matrix& m = w.m[i++ % w.m.size()];
    bonsai::TernaryOut o{m.blocks.data(), s.N, y.data()};
    if (tiled) o.tiles = m.tiled.tiles;
    cpu::ternary_matmul_multi(&o, 1, s.K, x.data(), M);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  // Wall-clock rates (the counters' own kIsRate would divide by CPU time unless UseRealTime).
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_secs = process_cpu_seconds() - cpu0;
  const double iters = double(state.iterations());
  state.counters["GB/s"] = weight_bytes(s) * iters / secs / 1e9;
  // Per busy core: bytes / CPU seconds of all threads (pool spinning included). On a loaded machine the
  // wall rate reflects the CPU share we got; this says what a core does while it runs.
  state.counters["GB/s/core"] = weight_bytes(s) * iters / cpu_secs / 1e9;
  if (M == 1 && g_probe_gbs.count(threads)) state.counters["of_probe"] = state.counters["GB/s"] / g_probe_gbs[threads];
  if (M > 1) state.counters["GMAC/s"] = double(M) * double(s.N) * double(s.K) * iters / secs / 1e9;
  cpu::set_ternary_activation(cpu::TernaryActivation::f32);
}

// The same bytes as the matvec, read and discarded through the same pool and row ranges: the plain read
// the matvec is measured against under identical conditions (threads, chunking, the machine's load now).
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t read_bytes_avx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a = _mm512_xor_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_loadu_si512(p + i + 64));
  }
  uint64_t out[8];
  _mm512_storeu_si512(out, _mm512_xor_si512(a, b));
  for (; i < n; ++i) out[0] += p[i];
  return out[0] ^ out[5];
}
__attribute__((target("avx2"))) uint64_t read_bytes_avx2(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  uint64_t out[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)));
  for (; i < n; ++i) out[0] += p[i];
  return out[0] ^ out[3];
}
#endif
uint64_t read_bytes_scalar(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s ^= v;
  }
  return s;
}

void bm_read(benchmark::State& state, Shape s, int threads) {
  cpu::set_num_threads(threads);
  Copies& w = weights(s);
  auto read = read_bytes_scalar;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) read = read_bytes_avx512;
  else if (__builtin_cpu_supports("avx2")) read = read_bytes_avx2;  // the scalar loop read ~15 GB/s where this reads ~21
#endif
  const int64_t rb = s.K / 128 * bonsai::kPq2Bytes;  // block bytes per row
  std::atomic<uint64_t> sink{0};
  size_t i = 0;
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const Matrix& m = w.m[i++ % w.m.size()];
    const uint8_t* blocks = m.blocks.data();
    cpu::parallel_for(0, s.N, 16, [&](int64_t lo, int64_t hi) { sink.fetch_xor(read(blocks + lo * rb, size_t((hi - lo) * rb))); });
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_secs = process_cpu_seconds() - cpu0;
  const double iters = double(state.iterations());
  state.counters["GB/s"] = weight_bytes(s) * iters / secs / 1e9;
  state.counters["GB/s/core"] = weight_bytes(s) * iters / cpu_secs / 1e9;
  benchmark::DoNotOptimize(sink.load());
}

// Compute ceiling: the kernel alone (one thread, no op layer) on a matrix that stays in L2 (K=5120,
// N=128: 170 KB), activation pre-quantised. GB/s here is weight bytes per CPU second: what the kernel could
// stream if memory were free; compare with the DRAM numbers to see which side limits.
void bm_incache(benchmark::State& state, const char* variant, int levels, int64_t M, bool tiled = false) {
  const cpu::Kernels* k = cpu::find_kernels(variant);
  if (!k) {
    state.SkipWithError("this CPU cannot run this variant");
    return;
  }
  const Shape s{5120, 128};
  const int64_t G = s.K / 128, L = std::max(1, levels);
  Matrix m{std::vector<uint32_t>(size_t(s.N * s.K / 16), 0x96a5a169u), std::vector<uint16_t>(size_t(s.N * G), 0x2000), {}};
  m.encode(s.N, s.K);
  const auto x = activation(M * s.K, 6);
  std::vector<int8_t> q(size_t(M * L * s.K));
  std::vector<float> qs(size_t(M * G));
  std::vector<int32_t> qsum(size_t(M * L * G));
  for (int64_t r = 0; r < M; ++r)
    k->quantize_q8(x.data() + r * s.K, s.K, int(L), q.data() + r * L * s.K, qs.data() + r * G, qsum.data() + r * L * G);
  std::vector<float> y(size_t(M * s.N));
  if (tiled) {
    if (!k->ternary_tiles_q8_x1 || levels == 0) {
      state.SkipWithError("no tiled kernel for this variant / precision");
      return;
    }
    m.tile(s.N, s.K);
  }
  for (auto _ : state) {
    if (tiled && M == 1)
      k->ternary_tiles_q8_x1(m.tiled.tiles, s.K, s.N, 0, cpu::tile_count(s.N), q.data(), qs.data(), qsum.data(), levels, y.data());
    else if (tiled)
      k->ternary_tiles_q8_xm(m.tiled.tiles, s.K, s.N, 0, cpu::tile_count(s.N), q.data(), qs.data(), qsum.data(), levels, M,
                             y.data(), s.N);
    else if (levels > 0 && M == 1)
      k->ternary_rows_q8_x1(m.blocks.data(), s.K, 0, s.N, q.data(), qs.data(), qsum.data(), levels,
                            y.data());
    else if (levels > 0)
      k->ternary_rows_q8_xm(m.blocks.data(), s.K, 0, s.N, q.data(), qs.data(), qsum.data(), levels, M,
                            y.data(), s.N);
    else if (M == 1)
      k->ternary_rows_x1(m.blocks.data(), s.K, 0, s.N, x.data(), y.data());
    else
      k->ternary_rows_xm(m.blocks.data(), s.K, 0, s.N, x.data(), M, y.data(), s.N);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double iters = double(state.iterations());
  state.counters["GB/s_cpu"] = benchmark::Counter(weight_bytes(s) * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GMAC/s_cpu"] =
      benchmark::Counter(double(M) * double(s.N) * double(s.K) * iters / 1e9, benchmark::Counter::kIsRate);
}

// One site's rotation: hadamard_forward of M rows of K with block 1024 (the 27B block).
void bm_fwht(benchmark::State& state, const char* variant, int64_t M, int64_t K, int threads) {
  setup(state, variant, threads);
  if (state.error_occurred()) return;
  auto x = activation(M * K, 2);
  std::vector<int8_t> signs(static_cast<size_t>(K));
  for (size_t i = 0; i < signs.size(); ++i) signs[i] = (i * 7 + 3) % 5 < 2 ? -1 : 1;
  for (auto _ : state) {
    cpu::hadamard_forward(x.data(), M, K, signs.data(), 1024);
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(double(M * K) * 8.0 * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void bm_quantize(benchmark::State& state, const char* variant, int levels, int64_t M, int64_t K, int threads) {
  setup(state, variant, threads);
  if (state.error_occurred()) return;
  const auto x = activation(M * K, 3);
  for (auto _ : state) {
    const cpu::ActQ8 q = cpu::quantize_activation(x.data(), M, K, levels);
    benchmark::DoNotOptimize(q.q);
    benchmark::ClobberMemory();
  }
  state.counters["Gelem/s"] =
      benchmark::Counter(double(M * K) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void bm_dot(benchmark::State& state, const char* variant, int64_t n) {
  const cpu::Kernels* k = cpu::find_kernels(variant);
  if (!k) {
    state.SkipWithError("this CPU cannot run this variant");
    return;
  }
  const auto a = activation(n, 4), b = activation(n, 5);
  for (auto _ : state) benchmark::DoNotOptimize(k->dot(a.data(), b.data(), n));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(n) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

std::string shape_name(const Shape& s) { return "K" + std::to_string(s.K) + "_N" + std::to_string(s.N); }

void register_all() {
  const char* env = std::getenv("BONSAI_BENCH_SHAPES");
  const bool small = env && !std::strcmp(env, "small");
  for (const Shape& s : kShapes) {
    if (small && !(s.N == 1024 || s.K == 6144)) continue;
    for (int t : {1, 2})
      benchmark::RegisterBenchmark(("read/" + shape_name(s) + "/t" + std::to_string(t)).c_str(),
                                   [=](benchmark::State& st) { bm_read(st, s, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    for (const char* v : kVariants) {
      const bool portable = !std::strcmp(v, "portable");
      for (int t : {1, 2})
        for (auto act : {cpu::TernaryActivation::q8, cpu::TernaryActivation::q16, cpu::TernaryActivation::q24,
                         cpu::TernaryActivation::f32}) {
          const char* names[] = {"f32", "q8", "q16", "q24"};
          const std::string a = names[int(act)];
          // The portable variant runs the multi-digit modes on the smallest shape only (slow).
          const bool multi = act == cpu::TernaryActivation::q16 || act == cpu::TernaryActivation::q24;
          if (portable && multi && s.N != 1024) continue;
          benchmark::RegisterBenchmark(("matvec/" + a + "/" + v + "/" + shape_name(s) + "/t" + std::to_string(t)).c_str(),
                                       [=](benchmark::State& st) { bm_ternary(st, v, act, s, 1, t); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
          const bool has_tiles = cpu::find_kernels(v) && cpu::find_kernels(v)->ternary_tiles_q8_x1;
          if (has_tiles && act != cpu::TernaryActivation::f32) {
            benchmark::RegisterBenchmark(("matvec_tiled/" + a + "/" + v + "/" + shape_name(s) + "/t" + std::to_string(t)).c_str(),
                                         [=](benchmark::State& st) { bm_ternary(st, v, act, s, 1, t, true); })
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
            if (s.N < 100000)
              benchmark::RegisterBenchmark(("gemm64_tiled/" + a + "/" + v + "/" + shape_name(s) + "/t" + std::to_string(t)).c_str(),
                                           [=](benchmark::State& st) { bm_ternary(st, v, act, s, 64, t, true); })
                  ->UseRealTime()
                  ->Unit(benchmark::kMillisecond);
          }
          // The GEMM is compute-bound: skip the slow portable variant and the head (prefill needs the
          // head for the last token only) except on the smallest shape.
          const bool head = s.N > 100000;
          if ((!portable && !head) || (s.N == 1024))
            benchmark::RegisterBenchmark(("gemm64/" + a + "/" + v + "/" + shape_name(s) + "/t" + std::to_string(t)).c_str(),
                                         [=](benchmark::State& st) { bm_ternary(st, v, act, s, 64, t); })
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
    }
  }
  for (const char* v : kVariants)
    for (int levels : {1, 2, 3, 0})
      for (int64_t M : {1, 64}) {
        const char* names[] = {"f32", "q8", "q16", "q24"};
        benchmark::RegisterBenchmark(
            (std::string("incache/") + names[levels] + "/" + v + "/M" + std::to_string(M) + "_K5120_N128").c_str(),
            [=](benchmark::State& st) { bm_incache(st, v, levels, M); })
            ->Unit(benchmark::kMicrosecond);
        if (levels > 0 && cpu::find_kernels(v) && cpu::find_kernels(v)->ternary_tiles_q8_x1)
          benchmark::RegisterBenchmark(
              (std::string("incache_tiled/") + names[levels] + "/" + v + "/M" + std::to_string(M) + "_K5120_N128").c_str(),
              [=](benchmark::State& st) { bm_incache(st, v, levels, M, true); })
              ->Unit(benchmark::kMicrosecond);
      }
  for (const char* v : kVariants) {
    for (int64_t K : {5120, 17408})
      for (int64_t M : {1, 64}) {
        const std::string suffix = "/M" + std::to_string(M) + "_K" + std::to_string(K) + "/t1";
        benchmark::RegisterBenchmark((std::string("fwht/") + v + suffix).c_str(),
                                     [=](benchmark::State& st) { bm_fwht(st, v, M, K, 1); })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
        for (int levels : {1, 3})
          benchmark::RegisterBenchmark((std::string("quantize_q8/L") + std::to_string(levels) + "/" + v + suffix).c_str(),
                                       [=](benchmark::State& st) { bm_quantize(st, v, levels, M, K, 1); })
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
      }
    benchmark::RegisterBenchmark((std::string("dot/") + v + "/n5120").c_str(),
                                 [=](benchmark::State& st) { bm_dot(st, v, 5120); })
        ->Unit(benchmark::kNanosecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const std::string chosen = cpu::kernels_name();
  std::fprintf(stderr, "bonsai cpu kernels: active variant %s\n", chosen.c_str());
  if (!std::getenv("BONSAI_BENCH_NO_PROBE")) {
    for (int t : {1, 2}) {
      const double c0 = process_cpu_seconds();
      const auto w0 = std::chrono::steady_clock::now();
      g_probe_gbs[t] = cpu::probe_read_bandwidth_gbs(t);
      const double busy = (process_cpu_seconds() - c0) /
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() / t;
      std::fprintf(stderr, "probe: streaming read %d thread%s: %.1f GB/s (the probe's threads ran %.0f%% of the time)\n",
                   t, t > 1 ? "s" : "", g_probe_gbs[t], 100 * busy);
    }
    for (int t : {1, 2})
      std::fprintf(stderr, "probe: int8 dot peak (%s) %d thread%s: %.0f Gop/s\n", chosen.c_str(), t, t > 1 ? "s" : "",
                  cpu::probe_int8_dot_peak_gops(t));
  }
  std::fflush(stderr);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
