// Bandwidth and int8-peak probes (see probe.h). Each worker runs on its own std::thread (not the op pool,
// so the probe's thread count is exactly what was asked), released together by a spin barrier; the time
// is the slowest worker's.
#include "backend/cpu/probe.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/kernels.h"
#include "util/large_buffer.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers warn (_mm256_undefined_*) when inlined into target-attribute functions.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace bonsai::cpu {
namespace {

using Clock = std::chrono::steady_clock;

#ifdef MADV_COLLAPSE
constexpr int kMadvCollapse = MADV_COLLAPSE;
#else
constexpr int kMadvCollapse = 25;  // Linux 6.1's value; headers older than the running kernel lack it
#endif

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, int(std::thread::hardware_concurrency()));
}

// Runs fn(t) on `threads` threads at once; returns the wall seconds from the common start to the last finish.
double run_parallel(int threads, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<Clock::time_point> end(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(t);
      end[size_t(t)] = Clock::now();
    });
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  const auto last = *std::max_element(end.begin(), end.end());
  return std::chrono::duration<double>(last - start).count();
}

// ---- read ----

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 64));
    c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 128));
    d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 192));
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
  uint64_t out[8];
  _mm512_storeu_si512(out, x);
  return out[0] ^ out[7];
}
__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a = _mm256_xor_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  uint64_t out[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x);
  return out[0] ^ out[3];
}
#endif
uint64_t read_scalar(const uint8_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    a ^= w[0];
    b ^= w[1];
    c ^= w[2];
    d ^= w[3];
  }
  return a ^ b ^ c ^ d;
}

uint64_t (*pick_read())(const uint8_t*, size_t) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return read_avx512;
  if (__builtin_cpu_supports("avx2")) return read_avx2;
#endif
  return read_scalar;
}

// ---- int8 peak: independent accumulators, register operands only ----

constexpr int64_t kPeakIters = 1 << 22;
// The accumulators' values land here so the loops are not optimised away; the functions return the
// number of multiply-adds they issued.
volatile int64_t g_peak_sink = 0;

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t peak_vnni(int64_t iters) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  g_peak_sink = _mm512_reduce_add_epi32(s);
  return iters * 12 * 64;
}
// Without VNNI the int8 product is vpmaddubsw (32 / 64 u8 x s8 multiply-adds into 16-bit pair sums), accumulated
// in 16 bits by vpaddw as the tiled kernels do (kernels_avx2.cpp). Each product reads its own accumulator, so it
// cannot be hoisted out of the loop: with constant operands (the form before) GCC computed maddubs(a, b) once and
// the loop timed vpaddd alone (648 "Gop/s" on a Zen 3 VM whose vpmaddubsw runs ~1.3 per cycle per core). 12 chains
// (latency ~4) keep 3 products in flight per cycle; in asm, because GCC kept an array of accumulators partly on
// the stack (stores in the loop).
#define BONSAI_PEAK_MADDUBS_LOOP(T, SET1, REDUCE, MACS)                                                       \
  T a0 = SET1(1), a1 = SET1(2), a2 = SET1(3), a3 = SET1(4), a4 = SET1(5), a5 = SET1(6), a6 = SET1(7),         \
    a7 = SET1(8), a8 = SET1(9), a9 = SET1(10), a10 = SET1(11), a11 = SET1(12), b = SET1(-1), t;               \
  for (int64_t it = 0; it < iters; ++it)                                                                      \
    asm volatile(BONSAI_PEAK_STEP(0) BONSAI_PEAK_STEP(1) BONSAI_PEAK_STEP(2) BONSAI_PEAK_STEP(3)              \
                 BONSAI_PEAK_STEP(4) BONSAI_PEAK_STEP(5) BONSAI_PEAK_STEP(6) BONSAI_PEAK_STEP(7)              \
                 BONSAI_PEAK_STEP(8) BONSAI_PEAK_STEP(9) BONSAI_PEAK_STEP(10) BONSAI_PEAK_STEP(11)            \
                 : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5), \
                   [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9), [a10] "+x"(a10),              \
                   [a11] "+x"(a11), [t] "=&x"(t)                                                             \
                 : [b] "x"(b));                                                                              \
  g_peak_sink = REDUCE(a0) + REDUCE(a1) + REDUCE(a2) + REDUCE(a3) + REDUCE(a4) + REDUCE(a5) + REDUCE(a6) +    \
                REDUCE(a7) + REDUCE(a8) + REDUCE(a9) + REDUCE(a10) + REDUCE(a11);                             \
  return iters * 12 * (MACS)
#define BONSAI_PEAK_STEP(i) "vpmaddubsw %[b], %[a" #i "], %[t]\n\tvpaddw %[t], %[a" #i "], %[a" #i "]\n\t"

__attribute__((target("avx512f,avx512bw"))) int64_t peak_avx512bw(int64_t iters) {
  BONSAI_PEAK_MADDUBS_LOOP(__m512i, _mm512_set1_epi8, _mm512_reduce_add_epi32, 64);
}
__attribute__((target("avx2"))) inline int64_t lane0_avx2(__m256i v) { return _mm256_extract_epi32(v, 0); }
__attribute__((target("avx2"))) int64_t peak_avx2(int64_t iters) {
  BONSAI_PEAK_MADDUBS_LOOP(__m256i, _mm256_set1_epi8, lane0_avx2, 32);
}
#undef BONSAI_PEAK_STEP
#undef BONSAI_PEAK_MADDUBS_LOOP
#endif
int64_t peak_scalar(int64_t iters) {
  volatile int8_t seed = 3;
  int32_t acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int8_t a = seed, b = int8_t(-seed);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 8; ++i) acc[i] += int8_t(acc[i]) * b + a;  // a dependent chain: no closed form
  int64_t s = 0;
  for (int i = 0; i < 8; ++i) s += acc[i];
  g_peak_sink = s;
  return iters * 8;
}

}  // namespace

double probe_read_bandwidth_gbs(int threads) {
  threads = resolve_threads(threads);
  const size_t bytes = size_t(512) << 20;
  const size_t slice = bytes / size_t(threads) / 4096 * 4096;
  // In 2 MiB pages (LargeVector: MADV_HUGEPAGE), as the model's weights are mapped: with THP in "madvise"
  // mode a plain aligned_alloc buffer sits in 4 KiB pages, whose TLB walks held this probe at 21-30 GB/s
  // on this VM while the decode streamed its huge-page-mapped weights at 29-33 GB/s.
  LargeVector<uint8_t> buf;
  try {
    buf.resize(bytes);
  } catch (const std::bad_alloc&) {
    return 0.0;
  }
  // First-touch each slice from the thread that reads it (NUMA placement), with non-zero bytes.
  run_parallel(threads, [&](int t) { std::memset(buf.data() + size_t(t) * slice, 0x5a + t, slice); });
  // A fault gets a 2 MiB page only when one is free at that moment: right after a 7 GB model ran, this VM
  // handed out 4 KiB pages and the probe read 32 GB/s instead of 60. MADV_COLLAPSE (Linux >= 6.1) compacts
  // and rebuilds the buffer in 2 MiB pages synchronously; best effort (older kernels: EINVAL, ignored).
  ::madvise(buf.data(), bytes, kMadvCollapse);
  const auto read = pick_read();
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  // Best of 10 passes (~20 ms each on two cores): on a machine shared with other work, some passes get
  // all the cores.
  for (int pass = 0; pass < 10; ++pass) {
    const double s = run_parallel(threads, [&](int t) { sink.fetch_xor(read(buf.data() + size_t(t) * slice, slice)); });
    best = std::max(best, double(slice) * threads / s / 1e9);
  }
  return best;
}

double probe_int8_dot_peak_gops(int threads) {
  threads = resolve_threads(threads);
  int64_t (*fn)(int64_t) = peak_scalar;
  const std::string name = kernels().name;
#if defined(__x86_64__)
  if (name == "avx512vnni") fn = peak_vnni;
  else if (name == "avx512bw") fn = peak_avx512bw;
  else if (name == "avx2") fn = peak_avx2;
#endif
  const int64_t iters = name == "portable" ? kPeakIters / 4 : kPeakIters / 16;
  std::vector<int64_t> macs(static_cast<size_t>(threads));
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    const double s = run_parallel(threads, [&](int t) { macs[size_t(t)] = fn(iters); });
    int64_t total = 0;
    for (int64_t m : macs) total += m;
    best = std::max(best, 2.0 * double(total) / s / 1e9);
  }
  return best;
}

}  // namespace bonsai::cpu
