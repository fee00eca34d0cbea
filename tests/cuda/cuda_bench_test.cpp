// Device measurements for docs/cuda-kernels.md, as gtest cases that run only when asked:
//   BONSAI_CUDA_BENCH=1 test_cuda --gtest_filter='CudaBench.*'
//   BONSAI_27B_PACK=<27b-pq2_0.gguf>  (bonsai make-pack --preset 27b) for the whole-model numbers
//   BONSAI_BENCH_OUT=<dir>            where bench_*.txt result lines are appended
// Numbers: streaming-read probe (GB/s), one ternary kernel per 27B shape (us, GB/s, % of the probe),
// 27b decode tok/s at batch 1 (graphs on/off), pp2048 prefill tok/s, device memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "cuda_test_util.h"
#include "model/forward.h"
#include "model/pack.h"

namespace bonsai {
namespace {

bool bench_enabled() {
  const char* e = std::getenv("BONSAI_CUDA_BENCH");
  return e && std::string(e) == "1";
}

void report(const std::string& file, const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (const char* d = std::getenv("BONSAI_BENCH_OUT")) std::ofstream(std::string(d) + "/" + file, std::ios::app) << line << "\n";
}

double probe_gbs() {
  static double gbs = 0;
  if (gbs == 0) gbs = cudatest::gpu().probe_read_gbs(8ull << 30, 10);
  return gbs;
}

// Fast random canonical words: one 64-bit draw gives 4 bytes of 4 codes in {0, 1, 2}.
void fill_matrix(TernaryMatrix& t, int64_t N, int64_t K, uint64_t seed) {
  uint8_t table[81];
  int i = 0;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 3; ++c)
        for (int d = 0; d < 3; ++d) table[i++] = uint8_t(a | b << 2 | c << 4 | d << 6);
  t.rows = N;
  t.cols = K;
  t.name = "bench." + std::to_string(N) + "x" + std::to_string(K);
  std::vector<uint32_t> words(size_t(N * K / 16));  // split form, encoded into the canonical blocks below
  std::vector<uint16_t> scales(size_t(N * K / 128));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& w : words) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= uint32_t(table[((s >> (16 * k)) & 0xffff) * 81 >> 16]) << (8 * k);
    w = v;
  }
  for (size_t j = 0; j < scales.size(); ++j) scales[j] = f32_to_fp16(0.004f + 0.02f * float(j % 97) / 97.f);
  t.assign_split(words.data(), scales.data(), N, K);
}

// BONSAI_BENCH_HOT=1 (round 24): every launch of a round reads ONE copy of the weights, so a product that fits in L2 is
// timed L2-hot (what a perfect prefetch would give it); the default rotates over >= 512 MB of copies, as a decode step
// reads them. The round has as many launches either way (a graph launch's cost is shared alike).
bool bench_hot() {
  const char* e = std::getenv("BONSAI_BENCH_HOT");
  return e && std::atoi(e) == 1;
}

// One kernel-table round's weights for outputs Ns of width K, prepared on be: list holds the launches' matrices in
// order (each launch takes Ns.size() of them). Returns the bytes one launch reads.
struct RoundWeights {
  std::deque<TernaryMatrix> mats;
  std::vector<const TernaryMatrix*> list;
};
uint64_t round_weights(CudaBackend& be, int64_t K, const std::vector<int64_t>& Ns, RoundWeights& w) {
  uint64_t bytes = 0;
  for (int64_t N : Ns) bytes += uint64_t(N * K / 4 + N * K / 128 * 2);
  const int copies = int(std::max<uint64_t>(2, std::min<uint64_t>(64, (1ull << 29) / bytes + 1)));
  const bool hot = bench_hot();
  TernaryMatrix proto[3];
  for (size_t j = 0; j < Ns.size(); ++j) fill_matrix(proto[j], Ns[j], K, j + 1);
  for (int c = 0; c < copies; ++c)
    for (size_t j = 0; j < Ns.size(); ++j) {
      if (!hot || c == 0) {
        w.mats.push_back(proto[j]);
        be.prepare_matrix(w.mats.back());
      }
      w.list.push_back(&w.mats[hot ? j : w.mats.size() - 1]);
    }
  return bytes;
}

TEST(CudaBench, ProbeAndTernaryKernels) {
  BONSAI_REQUIRE_GPU();
  if (!bench_enabled()) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1";
  CudaBackend& be = cudatest::gpu();
  const double probe = probe_gbs();
  report("bench_kernels.txt", "device " + be.device_name() + ", " + std::to_string(be.sm_count()) + " SMs");
  char buf[512];
  std::snprintf(buf, sizeof buf, "probe: streaming read of 8 GiB: %.0f GB/s", probe);
  report("bench_kernels.txt", buf);

  struct Shape {
    const char* name;
    int64_t K;
    std::vector<int64_t> N;
    int64_t M;
  };
  const std::vector<Shape> shapes = {
      {"ffn_gate", 5120, {17408}, 1},       {"gdn_qkv", 5120, {10240}, 1},        {"attn_q", 5120, {12288}, 1},
      {"gdn_z", 5120, {6144}, 1},           {"attn_k", 5120, {1024}, 1},          {"gdn_out", 6144, {5120}, 1},
      {"ffn_down", 17408, {5120}, 1},       {"head", 5120, {248320}, 1},          {"attn_o", 6144, {5120}, 1},
      {"gate+up", 5120, {17408, 17408}, 1}, {"qkv+z", 5120, {10240, 6144}, 1},    {"q+k+v", 5120, {12288, 1024, 1024}, 1},
      {"gate+up M64", 5120, {17408, 17408}, 64}, {"down M64", 17408, {5120}, 64}, {"gate+up M256", 5120, {17408, 17408}, 256},
      {"down M256", 17408, {5120}, 256},    {"gate+up M4", 5120, {17408, 17408}, 4}, {"down M4", 17408, {5120}, 4},
      {"gate+up M32", 5120, {17408, 17408}, 32}, {"down M32", 17408, {5120}, 32}, {"qkv+z M32", 5120, {10240, 6144}, 32},
      {"gate+up M8", 5120, {17408, 17408}, 8}, {"gate+up M2", 5120, {17408, 17408}, 2},
      {"qkv+z M64", 5120, {10240, 6144}, 64}, {"qkv+z M256", 5120, {10240, 6144}, 256},
      // round 9 (batched decode): more M = 3..32 rows
      {"gate+up M16", 5120, {17408, 17408}, 16}, {"down M8", 17408, {5120}, 8}, {"qkv+z M8", 5120, {10240, 6144}, 8},
      {"attn_o M32", 6144, {5120}, 32},         {"head M8", 5120, {248320}, 8}, {"head M32", 5120, {248320}, 32},
      {"gate+up M3", 5120, {17408, 17408}, 3},  {"attn_o M8", 6144, {5120}, 8}, {"qkv+z M16", 5120, {10240, 6144}, 16},
      {"down M16", 17408, {5120}, 16},
      // round 9c (split-K v6): ffn_down at two tokens
      {"down M2", 17408, {5120}, 2},
      // round 10 (batched decode at M 9..32)
      {"gate+up M12", 5120, {17408, 17408}, 12}, {"gate+up M24", 5120, {17408, 17408}, 24},
      {"gdn_out M32", 6144, {5120}, 32},        {"q+k+v M32", 5120, {12288, 1024, 1024}, 32},
  };
  report("bench_kernels.txt", "shape            M    K      N(s)                 MB/launch   us      GB/s   %probe  TOP/s");
  const char* only = std::getenv("BONSAI_BENCH_SHAPE");  // only these shapes: "ffn_down,down M2"
  const char* min_m = std::getenv("BONSAI_BENCH_MIN_M");  // only shapes with at least this many tokens
  const char* max_m = std::getenv("BONSAI_BENCH_MAX_M");  // only shapes with at most this many tokens
  const char* tags = std::getenv("BONSAI_BENCH_TAGS");    // only these variants: "q16 pdl,q16 v3 pdl"
  // Variants: q16 (the default, two digits) and q8 activations, timed back to back without and with
  // programmatic dependent launch; at M = 1 also the q8-only bulk-copy matvec v4; at M > 2 the GEMM v1
  // (mma.sync) and v2 (wgmma; 2 or 1 warpgroups per block; swizzled or not). (The round-4 "nowave" and non-pdl q16 variants
  // are gone: BONSAI_CUDA_WAVE_SPLIT=0 / BONSAI_CUDA_PDL=0 still work.)
  struct Variant {
    const char* tag;
    int matvec;
    bool pdl;
    int levels;
    int gemm;  // M > 2: 1 = mma.sync GEMM (round 4), 2 = wgmma GEMM v2 (round 5), 3 = warp-specialised v3 (round 7)
    int wgs;   // v2: warpgroups per block
    bool swz;  // v2: 128-byte swizzled operand tiles
    bool fixed = false;  // M <= 2: the matvec's round-5 grid (fixed row groups per warp; round 6: balanced)
    int cvt = 1;         // v3: the scaling's int -> float (1: I2FP, the default; 0: mantissa add)
    int mv6 = 0;         // matvec 6: block shape (Options::matvec6_cfg)
    int mvb = 1;         // Options::matvec_batch: 1 = off (the GEMM above v6's M), 2 = the batched kernel (round 9)
    int mvb_rb = 0;      // its row blocks per warp tile (0: auto)
    int mvb_pf = 1;      // its L2 prefetch (Options::matvec_batch_pf)
    int split = 0;       // v6 split-K (Options::matvec6_split: 1 = automatic, S = that many K slices; round 9c)
    bool ilv = true;     // its tile order (Options::matvec6_split_ilv: row tile major, else slice major)
    int mvw = 1;         // Options::matvec_wgmma: 1 = off, 2 = the batched wgmma kernel (round 10)
    int h = 0;           // Options::gemm_f16: GEMM v4 from this M (round 13; its xh_pack launch included in the time)
    int h_tile = 0;      // Options::gemm_f16_tile (0: chosen per shape; 2 = 256 x 64, 3 = 256 x 128, 4 = 128 x 128)
    int occ = 1;         // Options::gemm3_occ: v3's blocks per SM at M <= 32 (round 17)
    bool ru = true;      // Options::row_units (the default; M >= 64): the site's one unit per row, v3 scaling per token
                         // (round 19); false: one unit per 128-group
  };
  const Variant variants[] = {{"q16 pdl", 3, true, 2, 1, 2, true},          {"q16 fixed pdl", 3, true, 2, 1, 2, true, true},
                              {"q16 v2 pdl", 3, true, 2, 2, 2, true},       {"q16 v3 pdl", 3, true, 2, 3, 2, true},
                              {"q16 v3 mant pdl", 3, true, 2, 3, 2, true, false, 0},
                              {"q16 v2w1 pdl", 3, true, 2, 2, 1, true},     {"q16 v2 noswz pdl", 3, true, 2, 2, 2, false},
                              {"q8 pdl", 3, true, 1, 1, 2, true},           {"q8 v2 pdl", 3, true, 1, 2, 2, true},        {"q8 v3 pdl", 3, true, 1, 3, 2, true},
                              {"q8 v4", 4, false, 1, 1, 2, true},
                              // round 8: the tensor-core matvec v6 (matvec_mma.cu): the default shape and 1-7
                              {"q16 v6 pdl", 6, true, 2, 1, 2, true, false, 1, 0},   {"q16 v6c1 pdl", 6, true, 2, 1, 2, true, false, 1, 1},
                              {"q16 v6c2 pdl", 6, true, 2, 1, 2, true, false, 1, 2}, {"q16 v6c3 pdl", 6, true, 2, 1, 2, true, false, 1, 3},
                              {"q16 v6c4 pdl", 6, true, 2, 1, 2, true, false, 1, 4}, {"q16 v6c5 pdl", 6, true, 2, 1, 2, true, false, 1, 5},
                              {"q16 v6c6 pdl", 6, true, 2, 1, 2, true, false, 1, 6}, {"q16 v6c7 pdl", 6, true, 2, 1, 2, true, false, 1, 7},
                              {"q8 v6 pdl", 6, true, 1, 1, 2, true, false, 1, 0},
                              // round 10: v7 (the weights through a bulk-copy ring in shared memory): auto / 16 / 32 rows
                              {"q16 v7 pdl", 6, true, 2, 1, 2, true, false, 1, 8},   {"q16 v7r1 pdl", 6, true, 2, 1, 2, true, false, 1, 9},
                              {"q16 v7r2 pdl", 6, true, 2, 1, 2, true, false, 1, 10}, {"q8 v7 pdl", 6, true, 1, 1, 2, true, false, 1, 8},
                              // round 15: v7 on round 14's k16 step (the plain v7 tags run the k32 step)
                              {"q16 v7k16 pdl", 6, true, 2, 1, 2, true, false, 1, 11},
                              // round 9: the batched-decode kernel (matvec_mma_batch.cu), auto tile / 1 / 2 row blocks
                              {"q16 mvb pdl", 6, true, 2, 3, 2, true, false, 1, 0, 2, 0},
                              {"q16 mvb1 pdl", 6, true, 2, 3, 2, true, false, 1, 0, 2, 1},
                              {"q16 mvb2 pdl", 6, true, 2, 3, 2, true, false, 1, 0, 2, 2},
                              {"q8 mvb pdl", 6, true, 1, 3, 2, true, false, 1, 0, 2, 0},
                              {"q16 mvb pf0 pdl", 6, true, 2, 3, 2, true, false, 1, 0, 2, 0, 0},
                              {"q16 mvb pf2 pdl", 6, true, 2, 3, 2, true, false, 1, 0, 2, 0, 2},
                              // round 9c: v6 split-K (the automatic S, forced S = 2 / 4, with 4 steps in flight; row
                              // tile major, "z": slice major)
                              {"q16 v6s pdl", 6, true, 2, 1, 2, true, false, 1, 0, 1, 0, 1, 1},
                              {"q16 v6s2 pdl", 6, true, 2, 1, 2, true, false, 1, 0, 1, 0, 1, 2},
                              {"q16 v6s4 pdl", 6, true, 2, 1, 2, true, false, 1, 0, 1, 0, 1, 4},
                              {"q16 v6c5s2 pdl", 6, true, 2, 1, 2, true, false, 1, 5, 1, 0, 1, 2},
                              {"q16 v6c5s4 pdl", 6, true, 2, 1, 2, true, false, 1, 5, 1, 0, 1, 4},
                              {"q16 v6s2z pdl", 6, true, 2, 1, 2, true, false, 1, 0, 1, 0, 1, 2, false},
                              {"q16 v6s4z pdl", 6, true, 2, 1, 2, true, false, 1, 0, 1, 0, 1, 4, false},
                              // round 10: the batched-decode wgmma kernel (matvec_wgmma_batch.cu)
                              {"q16 mvw pdl", 6, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 2},
                              {"q8 mvw pdl", 6, true, 1, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 2},
                              // round 13: GEMM v4 (fp16 activations, gemm_f16.cu) at every M > 2
                              {"q16 h pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 3},
                              {"q16 h64 pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 3, 2},
                              {"q16 h128 pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 3, 3},
                              {"q16 h128r pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 3, 4},
                              // round 17: GEMM v3 two blocks per SM at M <= 32
                              {"q16 v3occ2 pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 0, 0, 2},
                              {"q8 v3occ2 pdl", 3, true, 1, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 0, 0, 2},
                              {"q16 v3occ2 mant pdl", 3, true, 2, 3, 2, true, false, 0, 0, 1, 0, 1, 0, true, 1, 0, 0, 2},
                              // round 25: one block per SM, double-buffered accumulators (with / without the turns)
                              {"q16 v3db pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 0, 0, 3},
                              {"q16 v3dbn pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 0, 0, 4},
                              // round 19: GEMM v3 on per-group units (the plain tags run row units, the default)
                              {"q16 v3g pdl", 3, true, 2, 3, 2, true, false, 1, 0, 1, 0, 1, 0, true, 1, 0, 0, 1, false}};
  const CudaBackend::Options base = be.options();
  for (const Shape& sh : shapes)
  for (const Variant& v : variants) {
    if (only && *only && ("," + std::string(only) + ",").find("," + std::string(sh.name) + ",") == std::string::npos) continue;
    if (min_m && sh.M < std::atoll(min_m)) continue;
    if (max_m && sh.M > std::atoll(max_m)) continue;
    if (tags && ("," + std::string(tags) + ",").find("," + std::string(v.tag) + ",") == std::string::npos) continue;
    if (v.fixed && sh.M > 2) continue;  // the GEMM either way
    if (sh.M > 1 && v.matvec == 4) continue;  // M > 1: one kernel (v3 or the GEMM), timed once per pdl mode
    if (v.gemm >= 2 && sh.M <= 2) continue;   // the matvec either way
    if (v.h > 0 && sh.M < v.h) continue;
    if (v.gemm >= 2 && v.levels == 1 && sh.M <= 4) continue;
    if (v.mvb == 2 && (sh.M <= (v.levels == 2 ? 2 : 4) || !cuda::matvec_batch_supported(sh.M, v.levels, sh.K))) continue;
    if (v.mvw == 2 && (sh.M <= (v.levels == 2 ? 2 : 4) || !cuda::matvec_wgmma_supported(sh.M, v.levels, sh.K))) continue;
    if (v.mvb != 2 && v.mvw != 2 && v.matvec == 6 && !cuda::matvec6_supported(sh.M, v.levels, sh.K)) continue;  // the GEMM either way
    CudaBackend::Options bo = base;
    bo.matvec = v.matvec;
    bo.act_levels = v.levels;
    bo.gemm = v.gemm;
    bo.gemm2_wgs = v.wgs;
    bo.gemm2_swizzle = v.swz;
    bo.gemm3_cvt = v.cvt;
    bo.gemm3_occ = v.occ;
    bo.row_units = v.ru;
    bo.matvec_balance = !v.fixed;
    bo.matvec6_cfg = v.mv6;
    bo.matvec7 = false;  // cfg 0 ("v6" tags) = the round-8 default; v7 by its cfg (8-10)
    bo.matvec_batch = v.mvb;
    bo.matvec_batch_rb = v.mvb_rb;
    bo.matvec_batch_pf = v.mvb_pf;
    bo.matvec_wgmma = v.mvw;
    bo.gemm_f16 = v.h;
    bo.gemm_f16_tile = v.h_tile;
    bo.matvec6_split = v.split;
    bo.matvec6_split_ilv = v.ilv;
    be.set_options(bo);
    RoundWeights w;
    const uint64_t bytes = round_weights(be, sh.K, sh.N, w);
    const double us = be.time_linear_kernel(w.list.data(), int(w.list.size()), int(sh.N.size()), sh.M, 20, v.pdl);
    const double gbs = double(bytes) / (us * 1e-6) / 1e9;
    double flops = 0;
    for (int64_t N : sh.N) flops += 2.0 * double(N) * double(sh.K) * double(sh.M);
    std::string ns;
    for (int64_t N : sh.N) ns += (ns.empty() ? "" : "+") + std::to_string(N);
    const std::string label = std::string(sh.name) + " " + v.tag;
    std::snprintf(buf, sizeof buf, "%-16s %-4lld %-6lld %-20s %-11.2f %-7.2f %-6.0f %-7.1f %.1f", label.c_str(),
                  (long long)sh.M, (long long)sh.K, ns.c_str(), double(bytes) / 1e6, us, gbs, 100.0 * gbs / probe,
                  flops / (us * 1e-6) / 1e12);
    report("bench_kernels.txt", buf);
    for (const TernaryMatrix& m : w.mats) be.release_matrix(m);
  }
  be.set_options(base);
}

// Round 15: what a kernel boundary and a grid-wide barrier cost on this GPU (CudaBackend::probe_sync_us), the two
// ways a decode step can order its stages; the barrier time per round includes 1 / rounds of a 4-byte memset.
// Round 30: the batch-1 FFN in one launch (ffn_fused.cu) against today's three launches, 27b shapes: 8 FFNs of distinct
// weights (568 MB, past L2) in one graph with programmatic edges, us per FFN and its bytes' share of the read probe.
TEST(CudaBench, FfnFusedVsThreeLaunches) {
  if (!bench_enabled()) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1";
  BONSAI_REQUIRE_GPU();
  const int64_t D = 5120, F = 17408;
  constexpr int kFfns = 8;
  std::deque<TernaryMatrix> mats;
  std::vector<const TernaryMatrix*> list;
  for (int f = 0; f < kFfns; ++f)
    for (int m = 0; m < 3; ++m) {
      mats.emplace_back();
      fill_matrix(mats.back(), m < 2 ? F : D, m < 2 ? D : F, uint64_t(3 * f + m + 1));
      list.push_back(&mats.back());
    }
  const auto x = cudatest::randn(size_t(D), 77);
  const auto signs = cudatest::random_signs(size_t(F), 78);
  const double bytes = 3.0 * double(F * D / 4 + F * D / 128 * 2), probe = probe_gbs();
  // Options::ffn_rows (the fused kernel's stage shape) x Options::ffn_b_copy (round 33: how ffn_down's stages are
  // copied); phases 1 / 2 time gate+up / ffn_down alone (their bytes: 2/3, 1/3 of the FFN's), 0 neither (the launch, the
  // group barrier and the SwiGLU site: the fused kernel's fixed cost, round 33's open question).
  // Round 34: Options::ffn_balance 1 / 2 (gate / up rows over all blocks: evenly, or so that both phases' bytes are).
  static const char* const kCopy[3] = {"bulk rows", "cp.async lanes", "tensor maps"};
  // Round 36: the barrier's arrival as one release (Options::ffn_release), with its own no-weights probes. Round 37: the
  // kernel's own sum of the partials (Options::ffn_reduce; the whole FFN only).
  using Form = cudatest::FfnForm;  // {rows, copy, balance, release, reduce}
  for (const Form& fm : {Form{32, 0, 0}, Form{32, 1, 0}, Form{32, 2, 0}, Form{32, 2, 0, true}, Form{32, 2, 0, true, true},
                         Form{32, 2, 1}, Form{32, 2, 2}, Form{16, 0, 0}}) {
    CudaBackend be(fm.on(CudaBackend::Options{}));
    for (const TernaryMatrix* m : list) be.prepare_matrix(*m);
    for (int rep = 0; rep < 2; ++rep)
      for (int phases : {-1, 3, 1, 2, 0, 4, 12}) {  // -1: the three launches; 4 / 12: phase 0 less the site / the barrier
        if (phases == -1 && (fm.rows != 32 || fm.copy != 0)) continue;
        if (fm.reduce && phases != 3) continue;
        if (phases >= 4 && (fm.rows != 32 || fm.copy != 2 || fm.balance != 0)) continue;
        // phases 1 / 0 copy no ffn_down stage: once per balance / arrival form
        if (((phases == 1 || phases == 0) && fm.copy != 0 && !fm.balance && !fm.release) || (phases != 3 && rep == 1))
          continue;
        const CudaBackend::FfnKernelRun r =
            be.run_ffn_kernel(list.data(), kFfns, x.data(), signs.data(), 1024, phases != -1, 50, phases < 0 ? 3 : phases);
        ASSERT_TRUE(r.ran);
        const double b = phases == 1 ? bytes * 2 / 3 : phases == 2 ? bytes / 3 : phases == 3 ? bytes : 0.0;
        const std::string bal = std::string(fm.balance == 1   ? ", balance 1 (gate / up even)"
                                            : fm.balance == 2 ? ", balance 2 (bytes even)"
                                                              : "") +
                                (fm.release ? ", release arrival" : "") + (fm.reduce ? ", own sum" : "");
        char line[256];
        if (phases == 0 || phases >= 4)
          std::snprintf(line, sizeof line, "ffn 27b, one fused launch, %d-row stages%s, no weights (%s): %.2f us", fm.rows,
                        bal.c_str(), phases == 0 ? "launch, group barrier, site" : phases == 4 ? "launch, group barrier" : "launch",
                        r.us);
        else if (phases == -1)
          std::snprintf(line, sizeof line, "ffn 27b, three launches: %.2f us an FFN (%.1f MB: %.1f %% of the %.0f GB/s probe)",
                        r.us, b / 1e6, 100.0 * b / (r.us * 1e-6) / 1e9 / probe, probe);
        else
          std::snprintf(line, sizeof line, "ffn 27b, one fused launch, %d-row stages, %s%s%s: %.2f us (%.1f MB: %.1f %% of the %.0f GB/s probe)",
                        fm.rows, kCopy[fm.copy], bal.c_str(), phases == 1 ? ", gate+up only" : phases == 2 ? ", ffn_down only" : "",
                        r.us, b / 1e6, 100.0 * b / (r.us * 1e-6) / 1e9 / probe, probe);
        report("bench_ffn.txt", line);
        EXPECT_GT(r.us, 0.0);
      }
  }
}

TEST(CudaBench, SyncCosts) {
  if (!bench_enabled()) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1";
  BONSAI_REQUIRE_GPU();
  for (int n : {100, 400}) {
    const CudaBackend::SyncCosts c = cudatest::gpu().probe_sync_us(n, n);
    char line[200];
    std::snprintf(line, sizeof line, "sync probe, %d launches / rounds, one 672-thread 200 KB block per SM: hop %.2f us, "
                  "grid barrier %.2f us", n, c.hop_us, c.barrier_us);
    report("bench_sync.txt", line);
    EXPECT_GT(c.hop_us, 0.0);
    EXPECT_GT(c.barrier_us, 0.0);
  }
}

// Round 20: the int8 rate GEMM v3's consumer loop can reach with its operands resident (CudaBackend::probe_wgmma_tops):
// the bare wgmma stream (A from registers, and from shared memory), then v3's loop and its pieces removed one at a time.
TEST(CudaBench, WgmmaCeiling) {
  if (!bench_enabled()) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1";
  BONSAI_REQUIRE_GPU();
  const char* names[cuda::kWgmmaProbeModes] = {"RS bare", "SS bare", "v3 loop", "v3 no turns", "v3 no scaling",
                                               "v3 + proxy fence", "v3 pinned fragments", "v3 mantissa cvt",
                                               "v3 split cvt", "v3 + thread arrivals", "v3 + warp arrivals"};
  for (int m = 0; m < cuda::kWgmmaProbeModes; ++m) {
    const double tops = cudatest::gpu().probe_wgmma_tops(m, 4096);
    char line[200];
    std::snprintf(line, sizeof line, "wgmma ceiling, 2 consumers x 8 m64n128k32 per group, 4096 groups: %-18s %.0f TOP/s",
                  names[m], tops);
    report("bench_wgmma.txt", line);
    EXPECT_GT(tops, 0.0);
  }
}

// The timeline's events come in the order the kernel passes them, in every block of every launch (a check of the
// diagnostic itself; it runs without BONSAI_CUDA_BENCH).
TEST(CudaMatvec7, TimelineIsOrderedInEveryBlock) {
  BONSAI_REQUIRE_GPU();
  if (!cuda::matvec7_trace_compiled()) GTEST_SKIP() << "the v7 timeline is compiled in with -DBONSAI_V7_TRACE only";
  CudaBackend& be = cudatest::gpu();
  std::deque<TernaryMatrix> mats;
  std::vector<const TernaryMatrix*> list;
  for (int c = 0; c < 3; ++c) {  // three launches of a 1,000 x 5,120 product (ragged 8-row units, several stages)
    mats.emplace_back();
    fill_matrix(mats.back(), 1000, 5120, c + 1);
    be.prepare_matrix(mats.back());
    list.push_back(&mats.back());
  }
  int blocks = 0;
  const std::vector<uint64_t> tr = be.trace_linear_kernel(list.data(), 3, 1, 1, blocks);
  ASSERT_EQ(tr.size(), size_t(3) * blocks * cuda::kV7TraceSlots) << "not three v7 launches";
  ASSERT_GT(blocks, 0);
  for (int l = 0; l < 3; ++l)
    for (int b = 0; b < blocks; ++b) {
      const uint64_t* r = tr.data() + (size_t(l) * blocks + b) * cuda::kV7TraceSlots;
      const int nt = int(r[cuda::kV7TrStages]);
      ASSERT_GE(nt, 1) << "launch " << l << " block " << b;
      EXPECT_GT(r[cuda::kV7TrStart], 0u);
      EXPECT_LE(r[cuda::kV7TrStart], r[cuda::kV7TrIssued]);
      EXPECT_LE(r[cuda::kV7TrStart], r[cuda::kV7TrConsumerWaited]);
      EXPECT_LE(r[cuda::kV7TrConsumerWaited], r[cuda::kV7TrStaged]);
      EXPECT_LE(r[cuda::kV7TrStaged], r[cuda::kV7TrFull0]);
      EXPECT_LE(r[cuda::kV7TrIssued], r[cuda::kV7TrFull0]);
      const int last = std::min(nt, cuda::kV7TrMaxStages) - 1;
      for (int j = 1; j <= last; ++j) EXPECT_LE(r[cuda::kV7TrFull0 + j - 1], r[cuda::kV7TrFull0 + j]);
      EXPECT_LE(r[cuda::kV7TrFull0 + last], r[cuda::kV7TrEmpty0 + last]);
      EXPECT_LE(r[cuda::kV7TrEmpty0 + last], r[cuda::kV7TrDone]);
      EXPECT_LE(r[cuda::kV7TrProducerWaited], r[cuda::kV7TrDone]);
    }
  for (const TernaryMatrix& m : mats) be.release_matrix(m);
}

// Round 24: where a matvec v7 launch's time goes, block by block (Mv7Args::trace, kernels.h). One round of launches
// over rotating copies (BONSAI_BENCH_HOT=1: one copy) with programmatic edges, as the kernel table times them; for the
// middle launch, each event's time after that launch's first block started: median / max over its blocks, in us.
TEST(CudaBench, V7Timeline) {
  BONSAI_REQUIRE_GPU();
  if (!bench_enabled()) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1";
  if (!cuda::matvec7_trace_compiled()) GTEST_SKIP() << "the v7 timeline is compiled in with -DBONSAI_V7_TRACE only";
  CudaBackend& be = cudatest::gpu();
  struct Shape {
    const char* name;
    int64_t K;
    std::vector<int64_t> N;
  };
  const Shape shapes[] = {{"gdn_out", 6144, {5120}},
                          {"ffn_down", 17408, {5120}},
                          {"qkv+z", 5120, {10240, 6144}},
                          {"gate+up", 5120, {17408, 17408}}};
  report("bench_timeline.txt", std::string("v7 timeline (us after the launch's first block start; median / max over "
                                           "blocks), ") + (bench_hot() ? "weights L2-hot" : "weights rotating (cold)"));
  for (const Shape& sh : shapes) {
    RoundWeights w;
    round_weights(be, sh.K, sh.N, w);
    int blocks = 0;
    const std::vector<uint64_t> tr =
        be.trace_linear_kernel(w.list.data(), int(w.list.size()), int(sh.N.size()), 1, blocks);
    ASSERT_FALSE(tr.empty()) << sh.name << ": not matvec v7 launches";
    const int launches = int(tr.size() / (size_t(blocks) * cuda::kV7TraceSlots)), li = launches / 2;
    auto at = [&](int l, int b, int slot) { return tr[(size_t(l) * blocks + b) * cuda::kV7TraceSlots + slot]; };
    uint64_t t0 = UINT64_MAX, t1 = UINT64_MAX, prev_done = 0;
    for (int b = 0; b < blocks; ++b) {
      t0 = std::min(t0, at(li, b, cuda::kV7TrStart));
      if (li + 1 < launches) t1 = std::min(t1, at(li + 1, b, cuda::kV7TrStart));
      prev_done = std::max(prev_done, at(li - 1, b, cuda::kV7TrDone));
    }
    // median / max over blocks of an event's time after t0 (slot_of(b): the block's slot, < 0 = not recorded)
    auto stat = [&](auto slot_of) {
      std::vector<double> v;
      for (int b = 0; b < blocks; ++b) {
        const int sl = slot_of(b);
        if (sl >= 0 && at(li, b, sl)) v.push_back((double(at(li, b, sl)) - double(t0)) * 1e-3);
      }
      if (v.empty()) return std::string("-");
      std::sort(v.begin(), v.end());
      char buf[48];
      std::snprintf(buf, sizeof buf, "%.2f/%.2f", v[v.size() / 2], v.back());
      return std::string(buf);
    };
    auto fixed = [](int slot) { return [slot](int) { return slot; }; };
    auto last = [&](int first) {  // the slot of the block's last recorded stage
      return [&, first](int b) {
        return first + int(std::min<uint64_t>(at(li, b, cuda::kV7TrStages), cuda::kV7TrMaxStages)) - 1;
      };
    };
    uint64_t st_min = UINT64_MAX, st_max = 0;
    for (int b = 0; b < blocks; ++b) {
      st_min = std::min(st_min, at(li, b, cuda::kV7TrStages));
      st_max = std::max(st_max, at(li, b, cuda::kV7TrStages));
    }
    char line[640];
    std::snprintf(line, sizeof line,
                  "%-8s blocks %d stages %llu-%llu | prev done %+.2f | start %s issued %s cons.waited %s staged %s "
                  "full0 %s full_last %s empty_last %s prod.waited %s done %s | next start %+.2f",
                  sh.name, blocks, (unsigned long long)st_min, (unsigned long long)st_max,
                  (double(prev_done) - double(t0)) * 1e-3, stat(fixed(cuda::kV7TrStart)).c_str(),
                  stat(fixed(cuda::kV7TrIssued)).c_str(), stat(fixed(cuda::kV7TrConsumerWaited)).c_str(),
                  stat(fixed(cuda::kV7TrStaged)).c_str(), stat(fixed(cuda::kV7TrFull0)).c_str(),
                  stat(last(cuda::kV7TrFull0)).c_str(), stat(last(cuda::kV7TrEmpty0)).c_str(),
                  stat(fixed(cuda::kV7TrProducerWaited)).c_str(), stat(fixed(cuda::kV7TrDone)).c_str(),
                  t1 == UINT64_MAX ? 0.0 : (double(t1) - double(t0)) * 1e-3);
    report("bench_timeline.txt", line);
    for (const TernaryMatrix& m : w.mats) be.release_matrix(m);  // the next shape's matrices may reuse these addresses
  }
}

TEST(CudaBench, Model27b) {
  BONSAI_REQUIRE_GPU();
  if (!bench_enabled()) GTEST_SKIP() << "set BONSAI_CUDA_BENCH=1";
  const char* path = std::getenv("BONSAI_27B_PACK");
  if (!path) GTEST_SKIP() << "set BONSAI_27B_PACK";
  using clk = std::chrono::steady_clock;
  char buf[512];
  const double probe = probe_gbs();
  auto t0 = clk::now();
  const Model m = load_model(path);
  const double t_load = std::chrono::duration<double>(clk::now() - t0).count();
  CudaBackend be;
  const uint64_t free0 = be.device_free_bytes();
  t0 = clk::now();
  be.prepare(m);
  const double t_up = std::chrono::duration<double>(clk::now() - t0).count();
  std::snprintf(buf, sizeof buf, "27b: load %.1f s, upload %.1f s; pack weights %.3f GB, device weights %.3f GB (x%.4f)",
                t_load, t_up, double(m.total_weight_bytes()) / 1e9, double(be.stats().weight_bytes) / 1e9,
                double(be.stats().weight_bytes) / double(m.total_weight_bytes()));
  report("bench_model.txt", buf);

  const int64_t V = m.head.rows;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> prompt(2048);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(V));

  for (int64_t chunk : {int64_t(64), int64_t(256)}) {
    Decoder dec(m, be, chunk);
    DecoderState s = dec.new_state(4096);
    // warm-up: one chunk, then start over
    dec.forward(s, prompt.data(), chunk, LogitsMode::Last, logits.data());
    dec.reset(s);
    be.synchronize();
    t0 = clk::now();
    for (int64_t p = 0; p < 2048; p += chunk)
      dec.forward(s, prompt.data() + p, chunk, p + chunk >= 2048 ? LogitsMode::Last : LogitsMode::None, logits.data());
    be.synchronize();
    const double tp = std::chrono::duration<double>(clk::now() - t0).count();
    std::snprintf(buf, sizeof buf, "27b pp2048 (chunks of %lld): %.3f s, %.0f tok/s", (long long)chunk, tp, 2048.0 / tp);
    report("bench_model.txt", buf);
    if (chunk != 64) continue;

    struct Mode {
      const char* name;
      bool graphs, pdl, fuse, fuse_site;
      int matvec;  // matvec version for M = 1 (6: tensor cores, 3: register ring, 4: bulk copies)
      int levels;  // activation digits: 2 (q16) or 1 (q8)
    } modes[] = {{"q16 graphs+pdl+fuse (default)", true, true, true, false, 6, 2},
                 {"q16 graphs+pdl+fuse, matvec v3", true, true, true, false, 3, 2},
                 {"q8 graphs+pdl+fuse", true, true, true, false, 6, 1},
                 {"q8, site as matvec prologue", true, true, true, true, 3, 1},
                 {"q8, matvec v4", true, true, true, false, 4, 1},
                 {"q16 eager+pdl+fuse", false, true, true, false, 6, 2}};
    for (const Mode& md : modes) {
      CudaBackend::Options o = be.options();
      o.graphs = md.graphs;
      o.pdl = md.pdl;
      o.fuse = md.fuse;
      o.matvec = md.matvec;
      o.fuse_site = md.fuse_site;
      o.act_levels = md.levels;
      be.set_options(o);
      for (int64_t ctx : {int64_t(2048), int64_t(16)}) {
        DecoderState d = dec.new_state(4096);
        if (ctx == 2048) {
          for (int64_t p = 0; p < 2048; p += chunk) dec.forward(d, prompt.data() + p, chunk, LogitsMode::None, nullptr);
        } else {
          dec.forward(d, prompt.data(), ctx, LogitsMode::None, nullptr);
        }
        int32_t id = 1;
        for (int w = 0; w < 8; ++w) {
          dec.forward(d, &id, 1, LogitsMode::Last, logits.data());
          id = int32_t((id * 31 + 7) % V);
        }
        const int steps = 128;
        const int64_t pos0 = d.pos;
        t0 = clk::now();
        for (int k = 0; k < steps; ++k) {
          dec.forward(d, &id, 1, LogitsMode::Last, logits.data());
          id = int32_t((id * 31 + 7) % V);
        }
        const double td = std::chrono::duration<double>(clk::now() - t0).count();
        const double tok_s = steps / td;
        const double bytes = double(m.decode_weight_bytes()) + double(dec.state_bytes_per_step(pos0 + steps / 2));
        std::snprintf(buf, sizeof buf,
                      "27b decode [%s] ctx %lld: %.1f tok/s, %.3f ms/token, %.1f MB/token, %.0f GB/s = %.1f%% of probe; "
                      "%llu kernels/step",
                      md.name, (long long)pos0, tok_s, 1e3 * td / steps, bytes / 1e6, bytes * tok_s / 1e9,
                      100.0 * bytes * tok_s / 1e9 / probe, (unsigned long long)be.stats().last_step_nodes);
        report("bench_model.txt", buf);
      }
    }
    be.set_options(CudaBackend::Options{});
    // Where the time goes: every kernel of 4 decode steps and of one 64-token prefill chunk timed alone
    // (eager, events around each launch: launch gaps excluded, PDL overlap lost).
    CudaBackend::Options po;
    po.graphs = false;
    po.profile = true;
    be.set_options(po);
    {
      DecoderState d = dec.new_state(4096);
      dec.forward(d, prompt.data(), chunk, LogitsMode::None, nullptr);
      be.profile_report();  // drop the chunk
      int32_t id = 3;
      for (int k = 0; k < 4; ++k) dec.forward(d, &id, 1, LogitsMode::Last, logits.data());
      report("bench_model.txt", "profile: 4 decode steps at ctx 64\n" + be.profile_report());
      dec.forward(d, prompt.data() + chunk, chunk, LogitsMode::None, nullptr);
      report("bench_model.txt", "profile: one 64-token prefill chunk at ctx 68\n" + be.profile_report());
    }
    // Batched decode, B = 32 sequences at ctx 16: one step profiled kernel by kernel, then 8 graph steps
    // timed with the [B, V] logits copied to the host (what the engine does).
    {
      constexpr int64_t B = 32;
      std::vector<DecoderState> ds;
      std::vector<DecoderState*> ptrs;
      for (int64_t b = 0; b < B; ++b) {
        ds.push_back(dec.new_state(256));
        dec.forward(ds.back(), prompt.data() + b, 16, LogitsMode::None, nullptr);
      }
      for (auto& x : ds) ptrs.push_back(&x);
      std::vector<int32_t> ids(static_cast<size_t>(B), 5);
      std::vector<float> blogits(static_cast<size_t>(B * V));
      be.profile_report();  // drop the prefill
      dec.step_batch(ptrs.data(), ids.data(), B, blogits.data());
      report("bench_model.txt", "profile: one batched step, B = 32 at ctx 16\n" + be.profile_report());
      be.set_options(CudaBackend::Options{});
      dec.step_batch(ptrs.data(), ids.data(), B, blogits.data());  // warm: graph build
      be.synchronize();
      t0 = clk::now();
      for (int k = 0; k < 8; ++k) dec.step_batch(ptrs.data(), ids.data(), B, blogits.data());
      be.synchronize();
      const double tb = std::chrono::duration<double>(clk::now() - t0).count() / 8;
      std::snprintf(buf, sizeof buf, "27b batched step B = 32 (graphs): %.3f ms/step, %.0f tok/s aggregate", 1e3 * tb,
                    double(B) / tb);
      report("bench_model.txt", buf);
      std::vector<int32_t> next(static_cast<size_t>(B));
      dec.step_batch_argmax(ptrs.data(), ids.data(), B, next.data());
      be.synchronize();
      t0 = clk::now();
      for (int k = 0; k < 8; ++k) dec.step_batch_argmax(ptrs.data(), ids.data(), B, next.data());
      be.synchronize();
      const double tg = std::chrono::duration<double>(clk::now() - t0).count() / 8;
      std::snprintf(buf, sizeof buf, "27b batched greedy step B = 32 (device argmax): %.3f ms/step, %.0f tok/s aggregate",
                    1e3 * tg, double(B) / tg);
      report("bench_model.txt", buf);
    }
    be.set_options(CudaBackend::Options{});
  }
  const CudaBackend::Stats st = be.stats();
  std::snprintf(buf, sizeof buf,
                "27b: device memory used by this process %.2f GB (weights %.2f GB); graph builds %llu, launches %llu, "
                "patched nodes %llu (%.1f per launch)",
                double(free0 - be.device_free_bytes()) / 1e9, double(st.weight_bytes) / 1e9,
                (unsigned long long)st.graph_builds, (unsigned long long)st.graph_launches,
                (unsigned long long)st.graph_patched_nodes,
                st.graph_launches ? double(st.graph_patched_nodes) / double(st.graph_launches) : 0.0);
  report("bench_model.txt", buf);
}

}  // namespace
}  // namespace bonsai
