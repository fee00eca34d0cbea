// CPU benchmarks of the non-matvec ops of a decode step and a prefill chunk, at the real 27B shapes, for
// every kernel variant this CPU runs (where the op goes through the kernel table), on 1 and 2 threads.
// (The ternary matvec / GEMM: bench_cpu_kernels.)
//
//   site/norm_rotate/<fused|unfused>/<variant>/M<rows>/t<threads>   residual site, E = 5120, block 1024:
//       fused = cpu::add_rmsnorm_rotate; unfused = add_rmsnorm + copy + hadamard_forward (the old sequence)
//   site/swiglu_rotate/<fused|unfused>/<variant>/M<rows>/t<threads> SwiGLU site, FF = 17408
//   gdn/step/t<threads>          the delta rule for one token: 48 V heads of 128 x 128 fp32 state (3.1 MB)
//   gdn/prefill/T<T>/t<threads>  the same over T tokens (token by token, the CPU default)
//   gdn/conv/T<T>/t<threads>     depthwise conv + SiLU over the 10240 qkv channels, 4 taps
//   attention/decode/T<T>/t<threads>  one query row, 24 q heads / 4 KV heads x 256, T cached positions
//
// Counters: GB/s = the bytes the op must move (activations read + written, state read + written, KV read)
// / wall time. A step of decode runs each site 2 x 64 times, the GDN ops 48 times, attention 16 times.
//
// Run: build/bench/bench_cpu_ops [--benchmark_filter=site/] [--benchmark_min_time=0.2]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/site.h"
#include "backend/cpu/thread_pool.h"

namespace cpu = bonsai::cpu;

namespace {

constexpr int64_t kE = 5120, kFF = 17408, kBlock = 1024;                  // 27B widths, Hadamard block
constexpr int64_t kNk = 16, kNv = 48, kDk = 128, kDv = 128, kKc = 4;      // 27B GDN
constexpr int64_t kConvC = 2 * kNk * kDk + kNv * kDv;                     // q | k | v channels: 10240
constexpr int64_t kHq = 24, kHkv = 4, kD = 256;                           // 27B attention
const char* const kVariants[] = {"avx512vnni", "avx512bw", "avx2", "portable"};

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<int8_t> signs(int64_t n) {
  std::mt19937 rng(5);
  std::vector<int8_t> s(static_cast<size_t>(n));
  for (auto& x : s) x = (rng() & 1) ? 1 : -1;
  return s;
}

bool setup(benchmark::State& state, const char* variant, int threads) {
  if (!cpu::set_kernels(variant)) {
    state.SkipWithError("this CPU cannot run this variant");
    return false;
  }
  cpu::set_num_threads(threads);
  return true;
}

// Runs body() per iteration and reports bytes / wall second.
template <class F>
void timed(benchmark::State& state, double bytes, F&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["GB/s"] = bytes * double(state.iterations()) / secs / 1e9;
  state.counters["us/call"] = secs / double(state.iterations()) * 1e6;
}

void bm_norm_rotate(benchmark::State& state, const char* variant, bool fused, int64_t M, int threads) {
  if (!setup(state, variant, threads)) return;
  auto h = randn(M * kE, 1), delta = randn(M * kE, 2, 0.01f), gain = randn(kE, 3);
  std::vector<float> out(size_t(M * kE)), site(size_t(M * kE));
  const auto sg = signs(kE);
  // h and delta read, h, out and site written (fp32).
  timed(state, 5.0 * 4 * double(M * kE), [&] {
    if (fused) {
      cpu::add_rmsnorm_rotate(h.data(), delta.data(), M, kE, gain.data(), 1e-6f, out.data(), site.data(), sg.data(),
                              kBlock);
    } else {
      cpu::add_rmsnorm(h.data(), delta.data(), M, kE, gain.data(), 1e-6f, out.data());
      std::copy(out.begin(), out.end(), site.begin());
      cpu::hadamard_forward(site.data(), M, kE, sg.data(), kBlock);
    }
  });
}

void bm_swiglu_rotate(benchmark::State& state, const char* variant, bool fused, int64_t M, int threads) {
  if (!setup(state, variant, threads)) return;
  const auto gate = randn(M * kFF, 4), up = randn(M * kFF, 5);
  std::vector<float> site(size_t(M * kFF));
  const auto sg = signs(kFF);
  timed(state, 3.0 * 4 * double(M * kFF), [&] {  // gate, up read; site written
    if (fused) {
      cpu::silu_mul_rotate(gate.data(), up.data(), M, kFF, site.data(), sg.data(), kBlock);
    } else {
      cpu::silu_mul(gate.data(), up.data(), M * kFF, site.data());
      cpu::hadamard_forward(site.data(), M, kFF, sg.data(), kBlock);
    }
  });
}

void bm_gdn(benchmark::State& state, int64_t T, int threads) {
  cpu::set_num_threads(threads);
  auto st = randn(kNv * kDk * kDv, 6, 0.1f);
  auto q = randn(T * kNk * kDk, 7), k = randn(T * kNk * kDk, 8), v = randn(T * kNv * kDv, 9);
  cpu::l2norm_heads(q.data(), T * kNk, kDk);
  cpu::l2norm_heads(k.data(), T * kNk, kDk);
  std::vector<float> g(size_t(T * kNv), -0.05f), beta(size_t(T * kNv), 0.5f), o(size_t(T * kNv * kDv));
  // The state is read and written once per token (it does not stay in a 1 MB L2), plus q, k, v, out.
  const double bytes = double(T) * (2.0 * 4 * double(kNv * kDk * kDv) + 4.0 * double(2 * kNk * kDk + 2 * kNv * kDv));
  timed(state, bytes, [&] {
    cpu::gdn_recurrent(st.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), T, kNk, kNv, kDk, kDv,
                       o.data());
  });
}

void bm_gdn_conv(benchmark::State& state, int64_t T, int threads) {
  cpu::set_num_threads(threads);
  const auto x = randn(T * kConvC, 10), taps = randn(kConvC * kKc, 11, 0.3f);
  auto cs = randn((kKc - 1) * kConvC, 12);
  std::vector<float> out(size_t(T * kConvC));
  timed(state, 4.0 * double(2 * T * kConvC + 2 * (kKc - 1) * kConvC + kKc * kConvC), [&] {
    cpu::gdn_conv(x.data(), cs.data(), taps.data(), T, kConvC, kKc, out.data());
  });
}

void bm_attention(benchmark::State& state, int64_t T, int threads) {
  cpu::set_num_threads(threads);
  const auto q = randn(kHq * kD, 13), kc = randn(T * kHkv * kD, 14), vc = randn(T * kHkv * kD, 15);
  std::vector<float> out(size_t(kHq * kD));
  timed(state, 2.0 * 4 * double(T * kHkv * kD), [&] {  // the K and V caches read once
    cpu::attention_decode(q.data(), kc.data(), vc.data(), T, kHq, kHkv, kD, float(1.0 / std::sqrt(double(kD))),
                          out.data());
  });
}

void register_all() {
  for (int threads : {1, 2}) {
    const std::string t = "/t" + std::to_string(threads);
    for (const char* v : kVariants)
      for (int64_t M : {1, 64})
        for (bool fused : {true, false}) {
          const std::string tail = std::string(fused ? "fused/" : "unfused/") + v + "/M" + std::to_string(M) + t;
          benchmark::RegisterBenchmark(("site/norm_rotate/" + tail).c_str(), bm_norm_rotate, v, fused, M, threads)
              ->UseRealTime();
          benchmark::RegisterBenchmark(("site/swiglu_rotate/" + tail).c_str(), bm_swiglu_rotate, v, fused, M, threads)
              ->UseRealTime();
        }
    benchmark::RegisterBenchmark(("gdn/step" + t).c_str(), bm_gdn, int64_t(1), threads)->UseRealTime();
    benchmark::RegisterBenchmark(("gdn/prefill/T64" + t).c_str(), bm_gdn, int64_t(64), threads)->UseRealTime();
    for (int64_t T : {int64_t(1), int64_t(64)})
      benchmark::RegisterBenchmark(("gdn/conv/T" + std::to_string(T) + t).c_str(), bm_gdn_conv, T, threads)
          ->UseRealTime();
    for (int64_t T : {int64_t(512), int64_t(4096), int64_t(32768)})
      benchmark::RegisterBenchmark(("attention/decode/T" + std::to_string(T) + t).c_str(), bm_attention, T, threads)
          ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
