// CudaBackend host logic: device memory, weight upload, the deferred-op peephole fusion, decode-step
// graphs. The kernels are in the .cu files beside it (see kernels.h).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <array>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/gemm3_fold.h"
#include "backend/cuda/kernels.h"
#include "util/error.h"
#include "util/half.h"

namespace bonsai {

namespace {

void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a sticky launch error where possible
    fail("CUDA error {} ({}) at {}:{} in `{}`", cudaGetErrorName(e), cudaGetErrorString(e), file, line, what);
  }
}
#define CUDA_CHECK(expr) cuda_check((expr), #expr, __FILE__, __LINE__)

constexpr int kDecodeSplits = int(cuda::kAttnMaxSplits);  // most attention splits per query row (decode)
constexpr int kPrefillSplits = 16;                         // most splits per query row of a prefill chunk
constexpr size_t kPinnedMax = 64u << 20;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

bool is_pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {
// Options::prefill_chunk's range (the environment and the constructor check the same rule).
bool prefill_chunk_ok(int64_t c) { return c >= 16 && c <= 4096 && c % 16 == 0; }
}  // namespace

CudaBackend::Options cuda_options(int device, const std::string& activations) {
  CudaBackend::Options o;
  o.device = device;
  auto flag = [](const char* name, bool def) {
    const char* e = std::getenv(name);
    if (!e || !*e) return def;
    return !(e[0] == '0' && e[1] == 0);
  };
  o.exact = flag("BONSAI_CUDA_EXACT", o.exact);
  if (const char* e = std::getenv("BONSAI_CUDA_SKIP"); e && *e) {
    o.skip = e;
    std::fprintf(stderr, "BONSAI_CUDA_SKIP=%s: those kernels are not launched; timings only, the results are wrong\n", e);
  }
  o.fuse_norm = flag("BONSAI_CUDA_FUSE_NORM", o.fuse_norm);
  o.attn_prep = flag("BONSAI_CUDA_ATTN_PREP", o.attn_prep);
  if (const char* e = std::getenv("BONSAI_CUDA_ATTN_PAIRS"); e && *e) o.attn_pairs = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_ATTN_HSPLIT"); e && *e) o.attn_hsplit = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_ATTN_LONG"); e && *e) o.attn_long = std::atoi(e);
  o.conv_dense = flag("BONSAI_CUDA_CONV_DENSE", o.conv_dense);
  o.graphs = flag("BONSAI_CUDA_GRAPHS", o.graphs);
  if (const char* e = std::getenv("BONSAI_CUDA_GRAPH_SEGMENT"); e && *e) o.graph_segment = std::max(0, std::atoi(e));
  o.pdl = flag("BONSAI_CUDA_PDL", o.pdl);
  o.fuse = flag("BONSAI_CUDA_FUSE", o.fuse);
  o.fuse_site = flag("BONSAI_CUDA_FUSE_SITE", o.fuse_site);
  o.site_warp = flag("BONSAI_CUDA_SITE_WARP", o.site_warp);
  if (const char* e = std::getenv("BONSAI_CUDA_NORM_CLUSTER"); e && *e) o.norm_cluster = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_SITE_XPOSE"); e && *e) o.site_xpose = std::atoi(e);
  o.gemm_wave_split = flag("BONSAI_CUDA_WAVE_SPLIT", o.gemm_wave_split);
  o.matvec_balance = flag("BONSAI_CUDA_MATVEC_BALANCE", o.matvec_balance);
  o.l2_prefetch = flag("BONSAI_CUDA_PREFETCH", o.l2_prefetch);
  if (const char* e = std::getenv("BONSAI_CUDA_GEMM"); e && *e) o.gemm = std::atoi(e);
  o.gemm2_swizzle = flag("BONSAI_CUDA_GEMM2_SWIZZLE", o.gemm2_swizzle);
  if (const char* e = std::getenv("BONSAI_CUDA_GEMM2_WGS"); e && *e) o.gemm2_wgs = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_GEMM3_CVT"); e && *e) o.gemm3_cvt = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_GEMM3_OCC"); e && *e) {
    const int v = std::atoi(e);
    o.gemm3_occ = v >= 2 && v <= 5 ? v : 1;
  }
  if (const char* e = std::getenv("BONSAI_CUDA_PREFILL_CHUNK"); e && *e) {
    const int c = std::atoi(e);
    if (!prefill_chunk_ok(c))
      fail("BONSAI_CUDA_PREFILL_CHUNK = '{}': expected a multiple of 16 in 16..4096", e);
    o.prefill_chunk = c;
  }
  if (const char* e = std::getenv("BONSAI_CUDA_MATVEC_ROWS"); e && *e) o.matvec_rows = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MATVEC"); e && *e) o.matvec = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MATVEC_EARLY"); e && *e) o.matvec_early = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MV6"); e && *e) o.matvec6_cfg = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MV6_SPLIT"); e && *e) o.matvec6_split = std::atoi(e);
  o.matvec6_split_any = flag("BONSAI_CUDA_MV6_SPLIT_ANY", o.matvec6_split_any);
  o.matvec6_split_ilv = flag("BONSAI_CUDA_MV6_SPLIT_ILV", o.matvec6_split_ilv);
  o.matvec7 = flag("BONSAI_CUDA_MV7", o.matvec7);
  if (const char* e = std::getenv("BONSAI_CUDA_MV7_K32"); e && *e) o.matvec7_k32 = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MV7_FIRST"); e && *e) o.matvec7_first = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MV7_EARLY"); e && *e) o.matvec7_early = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_SITE_PROLOGUE"); e && *e) o.site_prologue = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_SITE_EARLY"); e && *e) o.site_early = std::atoi(e);
  o.site_row = flag("BONSAI_CUDA_SITE_ROW", o.site_row);
  if (const char* e = std::getenv("BONSAI_CUDA_MVB"); e && *e) o.matvec_batch = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MVB_RB"); e && *e) o.matvec_batch_rb = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MVB_PF"); e && *e) o.matvec_batch_pf = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_MVW"); e && *e) o.matvec_wgmma = std::atoi(e);
  o.profile = flag("BONSAI_CUDA_PROFILE", o.profile);
  if (const char* e = std::getenv("BONSAI_CUDA_DELTA"); e && *e) o.delta = std::atoi(e);
  o.delta_mma = flag("BONSAI_CUDA_DELTA_MMA", o.delta_mma);
  if (const char* e = std::getenv("BONSAI_CUDA_DELTA_STEP"); e && *e) o.delta_step = std::atoi(e);
  o.delta_site = flag("BONSAI_CUDA_DELTA_SITE", o.delta_site);
  o.delta_conv = flag("BONSAI_CUDA_DELTA_CONV", o.delta_conv);
  o.ffn_fused = flag("BONSAI_CUDA_FFN_FUSED", o.ffn_fused);
  o.delta_out = flag("BONSAI_CUDA_DELTA_OUT", o.delta_out);
  if (const char* e = std::getenv("BONSAI_CUDA_FFN_ROWS"); e && *e) o.ffn_rows = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_FFN_BCOPY"); e && *e) o.ffn_b_copy = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_FFN_BALANCE"); e && *e) o.ffn_balance = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_FFN_BALANCE_W"); e && *e) o.ffn_balance_weight = float(std::atof(e));
  o.ffn_release = flag("BONSAI_CUDA_FFN_RELEASE", o.ffn_release);
  o.ffn_reduce = flag("BONSAI_CUDA_FFN_REDUCE", o.ffn_reduce);
  if (const char* e = std::getenv("BONSAI_CUDA_FFN_EARLY"); e && *e) o.ffn_early = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_SITE_ROW_NORM"); e && *e) o.site_row_norm = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_SITE_ROW_EARLY"); e && *e) o.site_row_norm_early = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_DELTA_ROWS"); e && *e) o.delta_rows = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_DELTA_SPLIT"); e && *e) o.delta_rows_split = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_ATTN"); e && *e) o.attn = std::atoi(e);
  if (const char* e = std::getenv("BONSAI_CUDA_ATTN_MMA"); e && *e) o.attn_prefill_mma = std::atoi(e);
  o.attn_planes = flag("BONSAI_CUDA_ATTN_PLANES", o.attn_planes);
  o.row_units = flag("BONSAI_CUDA_ROW_UNITS", o.row_units);
  o.site_rows_pipe = flag("BONSAI_CUDA_SITE_PIPE", o.site_rows_pipe);
  if (const char* e = std::getenv("BONSAI_CUDA_ACT"); e && *e) {
    const std::string v = e;
    if (v == "q8") o.act_levels = 1;
    else if (v == "q16") o.act_levels = 2;
    else if (v == "f16") o.act_levels = 2, o.gemm_f16 = CudaBackend::kF16MinRows;
    else fail("BONSAI_CUDA_ACT={}: expected q8, q16 or f16 (fp32 activations: BONSAI_CUDA_EXACT=1)", v);
  }
  // round 11, prefill
  o.site_norm_warp = flag("BONSAI_CUDA_SITE_NORM_WARP", o.site_norm_warp);
  o.gemm3_fold = flag("BONSAI_CUDA_GEMM3_FOLD", o.gemm3_fold);
  if (const char* e = std::getenv("BONSAI_CUDA_GEMMH"); e && *e) o.gemm_f16 = std::atoi(e);
  o.gemm_f16_head = flag("BONSAI_CUDA_GEMMH_HEAD", o.gemm_f16_head);
  if (const char* e = std::getenv("BONSAI_CUDA_GEMMH_TILE"); e && *e) o.gemm_f16_tile = std::atoi(e);
  // --act overrides the environment.
  if (activations == "q8" || activations == "q16" || activations == "f16") {
    o.act_levels = activations == "q8" ? 1 : 2;
    o.gemm_f16 = activations == "f16" ? CudaBackend::kF16MinRows : 0;
    o.exact = false;
  } else if (activations == "exact") {
    o.exact = true;
  } else if (!activations.empty()) {
    fail("--act '{}' is not an activation precision of the cuda backend: q8, q16, f16 or exact", activations);
  }
  // The two one-digit experiments say so when q16 replaces them (they are not wrong, just not used).
  if (o.act_levels == 2 && !o.exact && (o.matvec == 4 || o.fuse_site))
    std::fprintf(stderr, "bonsai: %s reads one activation digit (q8 only); under q16 the v3 matvec and the site "
                 "kernel run instead (--act q8 or BONSAI_CUDA_ACT=q8 to use it)\n",
                 o.matvec == 4 ? "BONSAI_CUDA_MATVEC=4" : "BONSAI_CUDA_FUSE_SITE=1");
  return o;
}

std::unique_ptr<Backend> make_cuda_backend(int device, const std::string& activations) {
  return std::make_unique<CudaBackend>(cuda_options(device, activations));
}

// ---------------------------------------------------------------------------------------------------

namespace {
std::string short_kernel_name(const void* func);
}  // namespace

struct CudaBackend::Impl {
  struct DevMatrix {
    const uint32_t* words = nullptr;   // u32 [N, K/16]
    const uint16_t* scales = nullptr;  // fp16 [N, K/128]
    int64_t N = 0, K = 0;
  };
  struct Const {
    void* ptr = nullptr;
    bool bf16 = false;  // dense weights stored as bf16 (only when every value round-trips exactly)
  };
  // A deferred op (see the header: fused into its consumer, else launched in order at the next flush).
  // ConvDense (round 29): a decode token's conv and its dense a / b pair, held for the delta step that reads them
  // (Options::delta_conv; else launched as gdn_conv_dense_launch).
  // Parts (round 30): ffn_fused's (round 31: or the delta step's out projection's) chunk partials [rows = parts][cols]
  // at src, summed into dst by the AddNorm site that reads dst (else by parts_sum_launch).
  enum class PK { Copy, Permute, SiluMul, SigMul, GNorm, L2, Scale, Gates, Dense, Norm, ConvDense, Parts };
  struct Pending {
    PK kind;
    float* dst = nullptr;         // Copy/Permute/SiluMul/GNorm out; SigMul/L2/Scale x; Gates g; ConvDense conv state
    float* dst2 = nullptr;        // Gates beta; Norm residual (add_rmsnorm) or null; ConvDense conv out
    const float* src = nullptr;   // Copy/Permute src; SiluMul gate; GNorm o; Gates a; Dense / ConvDense x
    const float* src2 = nullptr;  // SiluMul up; SigMul gate; GNorm z; Gates b; ConvDense the conv's input
    const float* gain = nullptr;  // GNorm gain; Gates A; ConvDense taps (device)
    const float* gain2 = nullptr; // Gates dt_bias
    const int32_t* perm = nullptr;
    int64_t ld_dst = 0, ld_src = 0, rows = 0, cols = 0;  // rows x cols, or n in cols; ConvDense: C, Kc, 1, dense K
    float f = 0.f;                                        // eps or scale
    cuda::DenseDev dense[2]{};
    int n_dense = 0;
    bool bf16 = false;
  };
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  // Step graphs kept (whole steps, or their segments under Options::graph_segment); all dropped when full.
  static constexpr size_t kGraphCache = 64;
  struct GraphEntry {
    uint64_t hash = 0;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::vector<cudaGraphNode_t> nodes;
    std::vector<cuda::Launch> recs;
  };

  Options opt;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  std::unordered_map<const TernaryMatrix*, DevMatrix> mats;
  std::unordered_map<const void*, Const> consts;
  std::vector<void*> owned;        // weight and constant allocations
  std::vector<void*> retired;      // scratch replaced while work may still read it: freed at a sync
  Stats st;

  Scratch xq, xds, attn_o, attn_ml, attn_cnt, ids, amr_out, topk_out, gemm_part;
  Scratch amr_v, amr_i, amr_cnt;  // argmax_rows partials: float / int64 [rows, chunks], counters int32 [rows] (zeroed)
  Scratch mv6_part, mv6_cnt;  // split-K v6: partials float [S, M, N], arrival counters int32 [N / 16] (zeroed)
  Scratch mvw_part, mvw_cnt;  // batched wgmma: partials float [2 SMs, 16, 512], counters int32 [row blocks] (zeroed)
  Scratch xh;                 // GEMM v4's fp16 activation tiles [ceil(M / 8)][K / 64][1024 B]
  // Round 24, diagnostic (BONSAI_CUDA_MV7_TRACE=<file>, in builds with -DBONSAI_V7_TRACE): every matvec v7 launch (and
  // since round 36 every fused FFN launch) of a recorded decode step writes its blocks' timeline (cuda::kV7TraceSlots
  // u64 per block) into trace_buf
  // [kTraceLaunches][SMs][slots]; the last step's is written to the file when the backend is destroyed
  // (tests/cuda/v7_trace_report.py reads it).
  static constexpr int64_t kTraceLaunches = 1024;
  std::string trace_path;
  uint64_t* trace_buf = nullptr;
  struct TraceMeta {
    int64_t K, N, blocks;
  };
  std::vector<TraceMeta> trace_meta, trace_last;  // this step's v7 launches, the previous step's
  const uint32_t* head_words = nullptr;  // the output head's device words (GEMM v4 leaves it to q16 unless gemm_f16_head)
  Scratch attn_planes;        // round 18: prefill attention's K / V window as f16 hi / lo planes [Hkv][4][p0 + M][D]
  Scratch site_cnt;           // v7's fused AddNorm site: int32 [2] {prologues done, residual slices written} (zeroed)
  Scratch delta_scratch;  // chunked delta rule: W, U, decayed Q/K, masked Q K^T per (V head, chunk)
  std::vector<cuda::Launch> launches;  // scratch list for one linear's launches (no allocation once warm)
  void* pinned = nullptr;
  size_t pinned_bytes = 0;

  struct Shadow {
    const float* x = nullptr;
    int64_t rows = 0, K = 0;
    uint64_t seq = ~0ull;
    bool row_units = false;  // the site used one unit per row (site_row_units)
  } shadow;
  uint64_t seq = 0;
  std::vector<Pending> pend;

  struct Prof {
    const void* func;
    cudaEvent_t e0, e1;
  };
  std::vector<Prof> prof;
  std::vector<cudaEvent_t> ev_pool;
  std::map<const void*, std::pair<int64_t, double>> prof_acc;  // func -> launches, ms
  std::vector<std::pair<const void*, float>> prof_last;         // the last synchronised batch in order: func, ms
  std::map<std::pair<const void*, int>, bool> skip_cache;        // Options::skip: (func, site pre-op) -> not launched

  // A prefix "name@P" skips only site_kernel launches whose pre-op (PreOp) is P, e.g. site_kernel@1 (the SwiGLU sites).
  bool skipped(const cuda::Launch& l) {
    const int pre = cuda::site_launch_pre(l);
    const auto key = std::make_pair(l.func, pre);
    auto it = skip_cache.find(key);
    if (it != skip_cache.end()) return it->second;
    const std::string name = short_kernel_name(l.func);
    bool skip = false;
    for (size_t b = 0; b <= opt.skip.size();) {
      size_t e = opt.skip.find(',', b);
      if (e == std::string::npos) e = opt.skip.size();
      std::string tok = opt.skip.substr(b, e - b);
      const size_t at = tok.find('@');
      const int want = at == std::string::npos ? -2 : std::atoi(tok.c_str() + at + 1);
      if (at != std::string::npos) tok.resize(at);
      if (!tok.empty() && name.rfind(tok, 0) == 0 && (want == -2 || want == pre)) skip = true;
      b = e + 1;
    }
    return skip_cache[key] = skip;
  }

  // A one-row site that produces the int8 activation, held back so the M = 1 matvec that consumes it
  // can compute it as its prologue (Options::fuse_site); any other op launches it first (flush_pending).
  bool deferred_site = false;
  cuda::SiteDesc site_desc;
  // A decode token's delta step, held back so the gated-norm site that reads its output can join its launch
  // (Options::delta_site, site()); any other launch emits it first (emit).
  bool held_delta = false;
  cuda::DeltaDesc delta_desc;
  cuda::DeltaConvIn delta_conv_in{};  // delta_desc.conv points here when the step computes its conv (Options::delta_conv)
  Scratch delta_site_cnt;  // the fused site's arrivals: int32 [Nv Dv / 1024] (zeroed, left zero by each launch)
  Scratch delta_conv_cnt;  // the fused conv's q / k readers per K head: int32 [Nk] (zeroed, left zero by each launch)
  // Round 31 (Options::delta_out): the held step's fused site, held once more for the out projection that reads its
  // digits (linear(): delta_out_launch); any other launch emits the step with its site first (emit_held_delta).
  bool held_delta_site = false;
  cuda::SiteDesc held_site_desc;
  Scratch delta_out_parts;  // its chunk partials float [Nv Dv / 1024, D] (summed by the next AddNorm site)
  Scratch delta_out_flags;  // its per-chunk flags int32 [2 Nv Dv / 1024] (zeroed, left zero by each launch)
  std::map<std::array<int64_t, 5>, bool> delta_out_fit;  // (levels, conv, bf16, D, Nv Dv) -> delta_out_resident
  Scratch ffn_parts;       // round 30: ffn_fused's chunk partials float [F / 1024, E] (summed by the next AddNorm site)
  Scratch ffn_tiles;       // round 37 (Options::ffn_reduce): its tile counters int32 [ceil(E / 32)], zero between launches
  Scratch ffn_cnt;         // its group counters: int32 [2 F / 1024] (zeroed, left zero by each launch)
  bool recording = false;
  std::vector<cuda::Launch> rec;
  // Index in rec of the step's last M = 1 matvec (-1: none yet): the next one patches it to prefetch its
  // weights into L2 (Options::l2_prefetch).
  int64_t last_matvec = -1;
  std::vector<GraphEntry> graphs;

  // ---- launching ----------------------------------------------------------------------------------
  // The int8 ternary kernel for M tokens: bulk-copy matvec (M = 1, q8), register-ring matvec (M <= 4 / 2), GEMM.
  // The int8 ternary product as launches (the split-K GEMM adds its ordered sum of the slices).
  // int8 digits per activation element in xq (Options::act_levels).
  int levels() const { return opt.act_levels == 1 ? 1 : 2; }
  // The fused FFN's forms from the options: Options::ffn_b_copy, with the tensor-map form (2) falling back to cp.async
  // lanes (1) where the driver's encoder is unreachable; Options::ffn_balance, falling back to the group split (0), not
  // to the three launches, where its table cannot hold the shape (192 blocks, 64 chunks) or the weight is out of range.
  void set_ffn_forms(cuda::FfnFusedDesc& d, int sms) const {
    d.rows_a = opt.ffn_rows;
    d.b_copy = opt.ffn_b_copy == 2 && !cuda::ffn_fused_tensor_maps_available() ? 1 : opt.ffn_b_copy;
    d.balance = opt.ffn_balance;
    d.balance_weight = opt.ffn_balance_weight;
    d.release = opt.ffn_release;
    d.early = opt.ffn_early;
    if (d.balance != 0 && !cuda::ffn_fused_shape_ok(d, sms)) d.balance = 0;
  }
  // Options::row_units where it pays: GEMM v3's scaling. Under --act f16 GEMM v4 has no per-group scaling to save and
  // its stated bound was measured on per-group units (with row units the fixture gate gave 724/726).
  bool row_units_on() const { return opt.row_units && opt.gemm_f16 == 0; }
  // q16 (two digits): the register-ring matvec and the GEMM; the bulk matvec v4 and the fused-site
  // prologue read one digit, so they are q8-only experiments (v3 runs in their place under q16).
  void ternary_launches(const cuda::TernaryDev* t, int n, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                        const cuda::SiteDesc* site, std::vector<cuda::Launch>& out) {
    const int sms = prop.multiProcessorCount, lv = levels();
    if (site && site->levels == 1 && !opt.site_prologue)  // the q8 experiment: the dp4a matvec computes it
      return out.push_back(cuda::matvec_launch(t, n, K, xq, xds, M, lv, sms, opt.matvec_rows, site, opt.matvec_balance));
    if (site) {  // round 11: v7 computes it (warp_site.cuh), else the site kernel runs first after all
      int32_t* cnt = nullptr;
      if (site->pre == cuda::kPreAddNorm && site->resid)
        cnt = static_cast<int32_t*>(ensure(site_cnt, 8, "fused-site counters", true));
      const int cfg7 = opt.matvec6_cfg == 0 && opt.matvec7 ? 8 : opt.matvec6_cfg;
      cuda::Launch l;
      if (opt.matvec == 6 && cuda::matvec7_site_launch(t, n, K, *site, sms, cfg7, cnt, l, opt.site_early,
                                                                      opt.site_prologue > 1 && (opt.site_prologue & 64))) return out.push_back(l);
      out.push_back(site_kernel_launch(*site));
    }
    if (opt.matvec == 4 && lv == 1 && cuda::matvec_bulk_supported(K, M))
      return out.push_back(cuda::matvec_bulk_launch(t, n, K, xq, xds, sms, opt.matvec_bulk_rows, opt.matvec_early));
    // v6 (matvec_mma.cu): the tensor-core matvec at M <= 2 (q16) / 4 (q8), except one token over a long K
    // (ffn_down, K = 17,408: v3 15.4 us vs v6 15.2-16.7 us, H200 round 8, docs/cuda-kernels.md; at M = 2 v6 wins
    // everywhere, e.g. gate+up 20.6 vs 60.9 us). BONSAI_CUDA_MV6 = 1..7 forces v6 there too.
    // Split-K v6 (Options::matvec6_split, round 9c; off by default): K cut into slices that are tiles of their own, so
    // ffn_down's 320 row tiles become 640 / 1280 over the SMs, the partials summed in slice order inside the launch.
    // Measured slower than v3 on the H200 (ffn_down M1 us: S = 2 20.9, S = 4 23.8, v3 15.3, v6 unsplit 16.7).
    if (opt.matvec == 6 && opt.matvec6_split != 0) {
      const int ks =
          cuda::matvec6_split_for(t, n, K, M, lv, sms, opt.matvec6_cfg, opt.matvec6_split, opt.matvec6_split_any);
      if (ks > 1) {
        auto* part = static_cast<float*>(ensure(mv6_part, size_t(ks * M * t[0].N) * 4, "split-K matvec partials"));
        auto* cnt = static_cast<int32_t*>(ensure(mv6_cnt, size_t((t[0].N + 15) / 16) * 4, "split-K matvec counters", true));
        return out.push_back(
            cuda::matvec6_launch(t, n, K, xq, xds, M, lv, sms, opt.matvec6_cfg, ks, part, cnt, opt.matvec6_split_ilv));
      }
    }
    // v7 (Options::matvec7, the default since round 10; BONSAI_CUDA_MV7=0: v6 + v3): the same products through a
    // bulk-copy ring in shared memory (matvec6_cfg 8), ffn_down included (H200, one call: tg128 185.9 vs 163.3 / 172.0
    // tok/s without it; ffn_down 14.4 vs v3 15.3 us; docs/cuda-kernels.md round 10).
    const int cfg6 = opt.matvec6_cfg == 0 && opt.matvec7 ? (opt.matvec7_k32 == 0 ? 11 : opt.matvec7_k32 == 2 ? 8 : 14) : opt.matvec6_cfg;
    if (opt.matvec == 6 && cuda::matvec6_supported(M, lv, K) && (M > 1 || K <= 8192 || cfg6 != 0))
      return out.push_back(cuda::matvec6_launch(t, n, K, xq, xds, M, lv, sms, cfg6, 1, nullptr, nullptr, true,
                                                opt.matvec7_first, opt.matvec7_early));
    // Batched decode (matvec_mma_batch.cu): the tensor-core kernel with a column per activation plane, above v6's M
    // up to 8 tokens and for products of >= 4 row blocks of 16 per SM, where it measured faster than v3 (H200 round 9,
    // us, mvb / v3 at M8 q16: gate+up 46.9 / 71.6, qkv+z 17.9 / 24.0, head 252 / 360; slower on the 5,120-row
    // products: ffn_down 30.6 / 28.9, attn_o 12.6 / 12.2, and at M16 on all but gate+up; docs/cuda-kernels.md).
    // Options::matvec_batch 1: off, 2: every M <= 32 and every shape.
    // Batched decode at M 9..32 (matvec_wgmma_batch.cu, round 10): 256-row blocks on wgmma, stream-K over the SMs.
    // Round 10 measured it faster than v3 only on gate+up (M32 62.3 vs 77.4 us); since round 11b's folded split-K v3 is
    // faster there too (57.4 vs 65.4 us), so it is off by default (Options::matvec_wgmma = 1; round 12).
    // GEMM v4 (gemm_f16.cu, round 13): fp16 activations and weights with their scales folded in, opt-in by M. At
    // M <= 32 only on products of >= 200 rows per SM (gate+up), the one shape where it beat v3 there (H200 round 13,
    // us, v4 / v3 at M32: gate+up 46.4 / 58.2, ffn_down 30.7 / 29.6, qkv+z 26.6 / 25.6, attn_o 18.3 / 13.3).
    int64_t rows = 0;  // all outputs' rows
    for (int i = 0; i < n; ++i) rows += t[i].N;
    if (opt.gemm_f16 > 0 && M >= opt.gemm_f16 && (M > 32 || rows >= 200 * int64_t(sms) || opt.gemm_f16_all) &&
        opt.tensor_cores &&
        cuda::gemm2_supported(prop.major, prop.minor) && (opt.gemm_f16_head || t[0].words != head_words)) {
      void* x16 = ensure(xh, size_t(cuda::gemmh_xh_bytes(M, K)), "fp16 activation tiles");
      out.push_back(cuda::xh_pack_launch(xq, xds, M, K, lv, x16));
      const cuda::GemmHPlan plan = cuda::gemmh_plan(t, n, K, M, sms, opt.gemm_f16_tile);
      const cuda::Gemm3Fold& f = plan.fold;
      if (f.kt > 1 && f.tiles - f.nfull <= kFoldHead) {  // the split's sums inside the GEMM (as v3's fold)
        float* buf = fold_buffer(f);
        return out.push_back(
            cuda::gemmh_launch(t, n, K, x16, M, plan, 1, 0, buf + kFoldHead, reinterpret_cast<int32_t*>(buf)));
      }
      // else (no split, or more split tiles than counters: then every tile is split) as GEMM v3's unfused split
      return split_k_launches(t, n, M, f.nfull == 0 ? f.kt : 1, out, [&](const cuda::TernaryDev* o, int kslices, int64_t stride) {
        return cuda::gemmh_launch(o, n, K, x16, M, plan, kslices, stride);
      });
    }
    if (opt.tensor_cores && cuda::gemm2_supported(prop.major, prop.minor) && cuda::matvec_wgmma_supported(M, lv, K) &&
        (opt.matvec_wgmma == 2 || (opt.matvec_wgmma == 0 && M > 8) ||
         (opt.matvec_wgmma == 3 && M > 8 && rows >= 64 * int64_t(sms)) ||
         (opt.matvec_wgmma == 4 && M > 8 && rows >= 200 * int64_t(sms) && rows < 1000 * int64_t(sms)))) {
      auto* part = static_cast<float*>(ensure(mvw_part, size_t(cuda::matvec_wgmma_part_floats(sms)) * 4, "batched wgmma partials"));
      auto* cnt = static_cast<int32_t*>(
          ensure(mvw_cnt, size_t(cuda::matvec_wgmma_row_blocks(t, n)) * 4, "batched wgmma counters", true));
      return out.push_back(cuda::matvec_wgmma_launch(t, n, K, xq, xds, M, lv, sms, part, cnt));
    }
    const int64_t v6_max = lv == 2 ? 2 : 4;
    const bool mvb_auto = M > v6_max && M <= 8 && rows >= 64 * int64_t(sms);
    if (opt.tensor_cores && cuda::matvec_batch_supported(M, lv, K) &&
        (opt.matvec_batch == 2 || (opt.matvec_batch == 0 && mvb_auto)))
      return out.push_back(
          cuda::matvec_batch_launch(t, n, K, xq, xds, M, lv, sms, opt.matvec_batch_rb, opt.matvec_batch_pf));
    // The dp4a matvec up to 4 tokens (q8) / 2 (q16: its M = 4 pass, 2 rows per step, measured slower than
    // the 32-token GEMM tile: gate+up 117 vs ~98 us, docs/cuda-kernels.md round 4).
    const int64_t mv_max = lv == 2 ? 2 : 4;
    if (M <= mv_max || !opt.tensor_cores)
      return out.push_back(cuda::matvec_launch(t, n, K, xq, xds, M, lv, sms, opt.matvec_rows, nullptr, opt.matvec_balance));
    // v3 (warp-specialised wgmma) on sm_90, v1 (mma.sync) elsewhere; Options::gemm 1 / 2 / 3 force one. v3
    // measured faster than v1 and v2 at every shape of the kernel table, M = 4 to 256 (H200 round 7, us, v3 /
    // v1 / v2: gate+up M4 67.5 / 81.9 / 95.4, M32 77.8 / 88.9 / 102.1, M64 101.0 / 147.6 / 164.5, M256 234.6 /
    // 460.1 / 421.1; down M256 115.0 / 281.8 / 206.8).
    const bool hopper = cuda::gemm2_supported(prop.major, prop.minor);
    const bool v3 = hopper && (opt.gemm == 3 || opt.gemm == 0);
    const bool v2 = hopper && opt.gemm == 2;
    const int wgs = opt.gemm2_wgs == 2 ? 2 : 1;
    // Round 17: two v3 blocks per SM (Options::gemm3_occ) at 9..32 tokens where the grid has more blocks than SMs:
    // below that each SM holds one block either way, and the two-block instance's ring is 7 stages instead of 12 (H200
    // kernel table, us, one / two blocks: gate+up M32 56.4 / 44.6, head M32 366 / 295, down M32 28.8 / 27.5 (40 tiles
    // x 6 slices), but attn_o M32 12.9 / 18.5: 40 tiles x 3 slices). At B = 4 / 8 the model was 3 % slower with it
    // (418 / 740 vs 406 / 720 tok/s) though down M8 ran 28.2 -> 26.6 us alone: not investigated, so M <= 8 keeps one.
    // Round 25: occ 3 / 4, the one-block instance with double-buffered accumulators (with / without turns), at 9..32;
    // 5: two blocks where the product alone has >= 2 tiles per SM (gate+up, head: the two-block instance measured
    // faster there, H200 us 44.1 vs 48.7 on gate+up M32), else the double-buffered one without turns (down M32 27.7 ->
    // 24.8, qkv+z 23.6 -> 21.3, gdn_out 12.4 -> 11.8); the default since round 26 (B = 16 / 32 +4 / +3.6 % over 2).
    // The rule: cuda::gemm3_occ_rule.
    const int occ = v3 ? cuda::gemm3_occ_rule(opt.gemm3_occ, t, n, K, M, lv, sms) : 1;
    // Round 19: the site that wrote xq (the shadow) used one unit per row: v3 scales per token (Options::row_units).
    const bool ru = shadow.row_units;
    const int ks = v3   ? cuda::gemm3_ksplit(t, n, K, M, lv, sms, occ)
                   : v2 ? cuda::gemm2_ksplit(t, n, K, M, lv, sms, wgs)
                        : cuda::gemm_ksplit(t, n, K, M, sms, opt.gemm_wave_split);
    auto gemm = [&](const cuda::TernaryDev* o, int kslices, int64_t stride) {
      return v3   ? cuda::gemm3_launch(o, n, K, xq, xds, M, lv, kslices, stride, opt.gemm3_cvt, occ, ru)
             : v2 ? cuda::gemm2_launch(o, n, K, xq, xds, M, lv, wgs, kslices, stride, opt.gemm2_swizzle)
                  : cuda::gemm_launch(o, n, K, xq, xds, M, lv, sms, kslices, stride);
    };
    if (v3 && opt.gemm3_fold) {  // round 11b: the split-K sums inside the GEMM, and the last wave split in K
      const cuda::Gemm3Fold f = cuda::gemm3_fold_plan(t, n, K, M, lv, sms, occ);
      if (f.kt > 1 && f.tiles - f.nfull <= kFoldHead) {
        float* buf = fold_buffer(f);
        return out.push_back(cuda::gemm3_fold_launch(t, n, K, xq, xds, M, lv, f, buf + kFoldHead,
                                                     reinterpret_cast<int32_t*>(buf), opt.gemm3_cvt, occ, ru));
      }
    }  // else (no split, or more split tiles than counters) as before
    split_k_launches(t, n, M, ks, out, gemm);
  }
  // gemm_part: kFoldHead int32 arrival counters of GEMM v3's folded split (zero: zeroed when allocated, left zero by
  // every launch; the partials below start after them, so neither path disturbs the other's), then the partials.
  static constexpr int64_t kFoldHead = 1024;
  // gemm_part for the folded split f (GEMM v3 or v4): the counters, then f's split tiles' partials.
  float* fold_buffer(const cuda::Gemm3Fold& f) {
    const int64_t pf = (f.tiles - f.nfull) * f.kt * f.tile_floats;
    return static_cast<float*>(ensure(gemm_part, size_t(kFoldHead + pf) * 4, "split-K partials", true));
  }
  // A GEMM over ks K slices: gemm(outs, ks, stride) alone (ks = 1), else into partials [ks][M * sum N] (output i's
  // slice z at part + z * stride + M * (N_0 + .. + N_{i-1})) and then each output's ordered sum of its slices.
  template <class Gemm>
  void split_k_launches(const cuda::TernaryDev* t, int n, int64_t M, int ks, std::vector<cuda::Launch>& out,
                        const Gemm& gemm) {
    if (ks == 1) return out.push_back(gemm(t, 1, 0));
    int64_t ntot = 0;
    for (int i = 0; i < n; ++i) ntot += t[i].N;
    const int64_t stride = M * ntot;
    auto* part = static_cast<float*>(ensure(gemm_part, size_t(kFoldHead + ks * stride) * 4, "split-K partials", true)) +
                 kFoldHead;
    cuda::TernaryDev tp[cuda::kMaxOuts];
    int64_t off = 0;
    for (int i = 0; i < n; ++i) {
      tp[i] = t[i];
      tp[i].y = part + off;
      off += M * t[i].N;
    }
    out.push_back(gemm(tp, ks, stride));
    for (int i = 0; i < n; ++i) out.push_back(cuda::splitk_sum_launch(tp[i].y, stride, ks, M * t[i].N, t[i].y));
  }
  void launch_now(const cuda::Launch& l) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = l.grid;
    cfg.blockDim = l.block;
    cfg.dynamicSmemBytes = l.smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    if (opt.pdl && !l.serial_in) {
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
    }
    void* params[1] = {const_cast<unsigned char*>(l.args)};
    if (opt.profile) {
      Prof p{l.func, event(), event()};
      CUDA_CHECK(cudaEventRecord(p.e0, stream));
      CUDA_CHECK(cudaLaunchKernelExC(&cfg, l.func, params));
      CUDA_CHECK(cudaEventRecord(p.e1, stream));
      prof.push_back(p);
      return;
    }
    CUDA_CHECK(cudaLaunchKernelExC(&cfg, l.func, params));
  }
  cudaEvent_t event() {
    if (!ev_pool.empty()) {
      cudaEvent_t e = ev_pool.back();
      ev_pool.pop_back();
      return e;
    }
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  // Milliseconds of `reps` runs of body() on the stream (events around each run), after `warmup` untimed ones
  // (the measurement helpers: probe_read_gbs, probe_sync_us, time_linear_kernel).
  template <class F>
  std::vector<float> timed_runs_ms(int warmup, int reps, F&& body) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < warmup + reps; ++r) {
      CUDA_CHECK(cudaEventRecord(e0, stream));
      body();
      CUDA_CHECK(cudaEventRecord(e1, stream));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= warmup) ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms;
  }
  // timed_runs_ms with programmatic launch off (a probe kernel alone on the stream; Options::pdl restored after).
  template <class F>
  std::vector<float> timed_runs_ms_eager(int warmup, int reps, F&& body) {
    const bool was = opt.pdl;
    opt.pdl = false;
    std::vector<float> ms = timed_runs_ms(warmup, reps, std::forward<F>(body));
    opt.pdl = was;
    return ms;
  }
  // The launches captured as one instantiated graph, with programmatic edges between them when `pdl`
  // (Options::pdl is left as it was). The caller destroys it (cudaGraphExecDestroy).
  cudaGraphExec_t capture_launches(const std::vector<cuda::Launch>& ls, bool pdl) {
    const bool was = opt.pdl;
    opt.pdl = pdl;
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (const cuda::Launch& l : ls) launch_now(l);
    CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    opt.pdl = was;
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));  // the instantiated graph does not need it
    return ge;
  }
  void collect_profile() {
    if (!prof.empty()) prof_last.clear();
    for (const Prof& p : prof) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, p.e0, p.e1));
      prof_last.emplace_back(p.func, ms);
      auto& a = prof_acc[p.func];
      a.first += 1;
      a.second += ms;
      ev_pool.push_back(p.e0);
      ev_pool.push_back(p.e1);
    }
    prof.clear();
  }

  // Points each v7 launch of ls (the product of t [n outputs] over K) at its slice of trace_buf (BONSAI_CUDA_MV7_TRACE;
  // recorded steps only).
  void trace_v7(std::vector<cuda::Launch>& ls, const cuda::TernaryDev* t, int n, int64_t K) {
    int64_t N = 0;
    for (int i = 0; i < n; ++i) N += t[i].N;
    for (cuda::Launch& l : ls)
      if (uint64_t* slice = next_trace_slice(); slice && cuda::matvec7_set_trace(l, slice))
        trace_meta.push_back({K, N, int64_t(l.grid.x)});
  }
  // The same for a fused FFN launch (round 36; its shape as K = D, N = 3 F: gate, up and ffn_down's rows).
  void trace_ffn(cuda::Launch& l, int64_t D, int64_t F) {
    if (uint64_t* slice = next_trace_slice(); slice && cuda::ffn_fused_set_trace(l, slice))
      trace_meta.push_back({D, 3 * F, int64_t(l.grid.x)});
  }
  // The same for the chain's small kernels (round 37; cuda::ChainKernel k as K = -k, N = 0; three events a block).
  void trace_chain(cuda::Launch& l) {
    const int64_t cap = int64_t(prop.multiProcessorCount) * cuda::kV7TraceSlots;
    uint64_t* slice = next_trace_slice();
    if (!slice) return;
    for (auto set : {cuda::site_row_chain_trace, cuda::conv_dense_chain_trace, cuda::delta_chain_trace})
      if (const cuda::ChainKernel k = set(l, slice, cap); k != cuda::ChainKernel::kNone) {
        trace_meta.push_back({-int64_t(k), 0, cuda::launch_blocks(l)});
        return;
      }
  }
  // The next launch's slice of trace_buf (allocated on first use), or null once it is full.
  uint64_t* next_trace_slice() {
    const int64_t per = int64_t(prop.multiProcessorCount) * cuda::kV7TraceSlots;
    if (!trace_buf) {
      trace_buf = static_cast<uint64_t*>(device_alloc(size_t(kTraceLaunches * per) * 8, "the v7 timeline"));
      CUDA_CHECK(cudaMemsetAsync(trace_buf, 0, size_t(kTraceLaunches * per) * 8, stream));
    }
    return int64_t(trace_meta.size()) < kTraceLaunches ? trace_buf + int64_t(trace_meta.size()) * per : nullptr;
  }
  // The last complete step's timeline into trace_path: a line "launch i K N blocks" per launch, then a line per block
  // of its kV7TraceSlots values (a chain kernel's three events in slots 0, 2 and 5: start, past the wait, done).
  void write_trace() {
    const std::vector<TraceMeta>& m = trace_last.empty() ? trace_meta : trace_last;
    if (!trace_buf || m.empty()) return;
    const int64_t per = int64_t(prop.multiProcessorCount) * cuda::kV7TraceSlots;
    std::vector<uint64_t> h(size_t(int64_t(m.size()) * per));
    CUDA_CHECK(cudaMemcpy(h.data(), trace_buf, h.size() * 8, cudaMemcpyDeviceToHost));
    FILE* f = std::fopen(trace_path.c_str(), "w");
    if (!f) return;
    for (size_t i = 0; i < m.size(); ++i) {
      std::fprintf(f, "launch %zu %lld %lld %lld\n", i, (long long)m[i].K, (long long)m[i].N, (long long)m[i].blocks);
      for (int64_t b = 0; b < m[i].blocks; ++b) {
        const uint64_t* r = h.data() + int64_t(i) * per + b * cuda::kV7TraceSlots;
        uint64_t chain[cuda::kV7TraceSlots] = {};
        if (m[i].K < 0) {
          const uint64_t* e = h.data() + int64_t(i) * per + 3 * b;
          chain[cuda::kV7TrStart] = e[cuda::kChainStart];
          chain[cuda::kV7TrConsumerWaited] = e[cuda::kChainWait];
          chain[cuda::kV7TrDone] = e[cuda::kChainDone];
          r = chain;
        }
        for (int k = 0; k < cuda::kV7TraceSlots; ++k) std::fprintf(f, k ? " %llu" : "%llu", (unsigned long long)r[k]);
        std::fprintf(f, "\n");
      }
    }
    std::fclose(f);
  }

  // The held delta step goes out before anything launched after it.
  void emit_held_delta() {
    const bool with_site = held_delta_site;
    held_delta_site = false;
    if (!held_delta) return;
    held_delta = false;
    if (with_site) {  // the step with its site, no out projection
      delta_desc.site = &held_site_desc;
      const cuda::Launch l = cuda::delta_launch(delta_desc);
      delta_desc.site = nullptr;
      return emit(l);
    }
    emit(cuda::delta_launch(delta_desc));
  }
  // Round 31: the held step + site + the out projection `out` of its digits as one launch (delta_out_supported and
  // resident), its partials pending for the AddNorm site; false: nothing launched (the caller's path emits the step).
  bool delta_out_launch(const LinearOut& out, int64_t K) {
    const DevMatrix& m = matrix(out.w);
    const int64_t C = K / 1024;
    cuda::DeltaOutDesc od;
    od.words = m.words;
    od.scales = m.scales;
    od.D = m.N;
    od.parts = static_cast<float*>(ensure(delta_out_parts, size_t(C * m.N) * 4, "fused GDN out partials"));
    od.flags = static_cast<int32_t*>(ensure(delta_out_flags, size_t(2 * C) * 4, "fused GDN out flags", true));
    delta_desc.site = &held_site_desc;
    delta_desc.out_proj = &od;
    bool ok = K == held_site_desc.K && cuda::delta_out_supported(delta_desc);
    if (ok) {
      const std::array<int64_t, 5> key{held_site_desc.levels, delta_desc.conv != nullptr,
                                       delta_desc.conv && delta_desc.conv->bf16, m.N, K};
      auto it = delta_out_fit.find(key);
      if (it == delta_out_fit.end())
        it = delta_out_fit.emplace(key, cuda::delta_out_resident(delta_desc, prop.multiProcessorCount)).first;
      ok = it->second;
    }
    cuda::Launch l{};
    if (ok) l = cuda::delta_launch(delta_desc);
    delta_desc.site = nullptr;
    delta_desc.out_proj = nullptr;
    if (!ok) return false;
    held_delta = held_delta_site = false;
    emit_with_parts(l, out.y, od.parts, C, m.N);
    return true;
  }
  // A launch that leaves its output as n chunk partials [n][stride] (ffn_fused, the delta step's out projection):
  // dst = their sum is pending, for the AddNorm site that reads dst to take (else parts_sum_launch). parts null: the
  // launch wrote dst itself (ffn_fused with FfnFusedDesc::y), nothing pending.
  void emit_with_parts(const cuda::Launch& l, float* dst, float* parts, int64_t n, int64_t stride) {
    emit(l);
    last_matvec = -1;  // no v7 launch to patch with the next product's L2 prefetch
    if (!parts) return;
    Pending q{PK::Parts};
    q.dst = dst;
    q.src = parts;
    q.rows = n;
    q.cols = stride;
    defer(q);
  }
  void emit(const cuda::Launch& l) {
    emit_held_delta();
    if (!opt.skip.empty() && skipped(l)) return;
    ++st.kernels;
    if (!recording) return launch_now(l);
    rec.push_back(l);
    if (!trace_path.empty()) trace_chain(rec.back());
    // Options::graph_segment: the recorded part goes to the GPU now (as its own cached graph), so the GPU runs the
    // step's first layers while the host records the rest. The boundary costs the programmatic edge between two
    // kernels; the segments fall at the same launch indices every step, so they hit the cache as whole steps do.
    if (opt.graph_segment > 0 && rec.size() >= size_t(opt.graph_segment)) {
      run_graph();
      rec.clear();
      last_matvec = -1;  // the L2 prefetch hook patches only launches still in rec
    }
  }

  // ---- deferred ops ---------------------------------------------------------------------------------
  void launch_pending(const Pending& p) {
    switch (p.kind) {
      case PK::Copy: emit(cuda::copy_rows_launch(p.dst, p.ld_dst, p.src, p.ld_src, p.rows, p.cols)); break;
      case PK::Permute: emit(cuda::permute_launch(p.src, p.rows, p.cols, p.perm, p.dst)); break;
      case PK::SiluMul: emit(cuda::silu_mul_launch(p.src, p.src2, p.cols, p.dst)); break;
      case PK::SigMul: emit(cuda::sigmoid_mul_launch(p.dst, p.src2, p.cols)); break;
      case PK::GNorm: emit(cuda::gated_rmsnorm_launch(p.src, p.src2, p.gain, p.rows, p.cols, p.f, p.dst)); break;
      case PK::L2: emit(cuda::l2norm_launch(p.dst, p.rows, p.cols, p.f)); break;
      case PK::Scale: emit(cuda::scale_launch(p.dst, p.cols, p.f)); break;
      case PK::Gates: emit(cuda::gdn_gates_launch(p.src, p.src2, p.gain, p.gain2, p.rows, p.cols, p.dst, p.dst2)); break;
      case PK::Dense: emit(cuda::dense_launch(p.dense, p.n_dense, p.bf16, p.cols, p.src, p.rows)); break;
      case PK::ConvDense:
        emit(cuda::gdn_conv_dense_launch(p.src2, p.dst, p.gain, p.ld_dst, p.ld_src, p.dst2, p.dense, p.n_dense, p.bf16,
                                         p.cols, p.src));
        break;
      case PK::Parts: emit(cuda::parts_sum_launch(p.src, p.rows, p.cols, p.dst)); break;
      case PK::Norm:
        emit(p.dst2 ? cuda::add_rmsnorm_launch(p.dst2, p.src, p.rows, p.cols, p.gain, p.f, p.dst)
                    : cuda::rmsnorm_launch(p.src, p.rows, p.cols, p.gain, p.f, p.dst));
        break;
    }
  }
  void flush_pending() {
    emit_held_delta();
    if (deferred_site) {  // it precedes everything still pending (its producers were folded into it)
      deferred_site = false;
      emit(site_kernel_launch(site_desc));
    }
    for (const Pending& p : pend) launch_pending(p);
    pend.clear();
  }
  void defer(const Pending& p) {
    if (opt.fuse) pend.push_back(p);
    else {
      flush_pending();
      launch_pending(p);
    }
  }
  const Pending* tail() const { return pend.empty() ? nullptr : &pend.back(); }
  // The attention launch with its split scratch (partials [M, Hq, S, D] and [M, Hq, S, 2], counters [M, Hkv]).
  void emit_attention(cuda::AttnDesc& d) {
    if (d.splits > 1) {
      const int64_t M = d.M, S = d.splits;
      d.part_o = static_cast<float*>(ensure(attn_o, size_t(M * d.Hq * S * d.D) * 4, "attention partials"));
      d.part_ml = static_cast<float*>(ensure(attn_ml, size_t(M * d.Hq * S * 2) * 4, "attention partials"));
      d.counters = static_cast<int32_t*>(ensure(attn_cnt, size_t(M * d.Hq) * 4, "attention counters", true));  // [M, Hkv * hsplit <= Hq]
    }
    emit(cuda::attention_launch(d));
  }
  void emit_delta(float* state, const cuda::RowTable* rows, const float* q, const float* k, const float* v,
                  const float* g, const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                  float* out);

  // ---- steps and graphs -----------------------------------------------------------------------------
  void begin_step() {
    end_step();
    flush_pending();
    recording = true;
    rec.clear();
    last_matvec = -1;
    st.last_step_nodes = 0;
    if (!trace_meta.empty()) trace_last.swap(trace_meta);
    trace_meta.clear();
  }
  void end_step() {
    if (!recording) return;
    flush_pending();
    recording = false;
    run_graph();
    rec.clear();
  }
  // A sync point: everything issued so far is on the stream.
  void drain() {
    end_step();
    flush_pending();
  }
  void sync() {
    drain();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (void* p : retired) cudaFree(p);
    retired.clear();
    collect_profile();
  }

  static cudaKernelNodeParams node_params(const cuda::Launch& l, void** holder) {
    cudaKernelNodeParams p{};
    p.func = const_cast<void*>(l.func);
    p.gridDim = l.grid;
    p.blockDim = l.block;
    p.sharedMemBytes = l.smem;
    holder[0] = const_cast<unsigned char*>(l.args);
    p.kernelParams = holder;
    p.extra = nullptr;
    return p;
  }

  void run_graph() {
    if (rec.empty()) return;
    st.last_step_nodes += rec.size();  // reset by begin_step: a step's segments add up
    uint64_t h = rec.size();
    for (const cuda::Launch& l : rec) {
      h = mix(h, reinterpret_cast<uint64_t>(l.func));
      h = mix(h, (uint64_t(l.grid.x) << 32) ^ (uint64_t(l.grid.y) << 16) ^ l.grid.z);
      h = mix(h, (uint64_t(l.block.x) << 32) ^ (uint64_t(l.smem) << 8) ^ l.size);
    }
    GraphEntry* e = nullptr;
    for (GraphEntry& g : graphs) {
      if (g.hash != h || g.recs.size() != rec.size()) continue;
      bool same = true;
      for (size_t i = 0; i < rec.size() && same; ++i) same = g.recs[i].same_shape(rec[i]);
      if (same) {
        e = &g;
        break;
      }
    }
    if (e) {
      for (size_t i = 0; i < rec.size(); ++i) {
        if (e->recs[i].same_args(rec[i])) continue;
        void* holder[1];
        cudaKernelNodeParams p = node_params(rec[i], holder);
        CUDA_CHECK(cudaGraphExecKernelNodeSetParams(e->exec, e->nodes[i], &p));
        e->recs[i] = rec[i];
        ++st.graph_patched_nodes;
      }
    } else {
      if (graphs.size() >= kGraphCache) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (GraphEntry& g : graphs) {
          cudaGraphExecDestroy(g.exec);
          cudaGraphDestroy(g.graph);
        }
        graphs.clear();
      }
      GraphEntry g;
      g.hash = h;
      CUDA_CHECK(cudaGraphCreate(&g.graph, 0));
      g.nodes.resize(rec.size());
      for (size_t i = 0; i < rec.size(); ++i) {
        void* holder[1];
        cudaKernelNodeParams p = node_params(rec[i], holder);
        CUDA_CHECK(cudaGraphAddKernelNode(&g.nodes[i], g.graph, nullptr, 0, &p));
        if (i > 0) {
          cudaGraphEdgeData ed{};
          if (opt.pdl && !rec[i].serial_in) {
            ed.from_port = cudaGraphKernelNodePortProgrammatic;
            ed.type = cudaGraphDependencyTypeProgrammatic;
          }
          CUDA_CHECK(cudaGraphAddDependencies(g.graph, &g.nodes[i - 1], &g.nodes[i], &ed, 1));
        }
      }
      CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
      g.recs = rec;
      graphs.push_back(std::move(g));
      e = &graphs.back();
      ++st.graph_builds;
    }
    CUDA_CHECK(cudaGraphLaunch(e->exec, stream));
    ++st.graph_launches;
  }

  // ---- memory -------------------------------------------------------------------------------------
  void* device_alloc(size_t bytes, const char* what) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 16));
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t fr = 0, tot = 0;
      cudaMemGetInfo(&fr, &tot);
      fail("CUDA backend: cannot allocate {:.3f} GB of device memory for {} ({}; {:.2f} GB free of {:.2f} GB on {})",
           double(bytes) / 1e9, what, cudaGetErrorString(e), double(fr) / 1e9, double(tot) / 1e9, prop.name);
    }
    return p;
  }
  // Grows a scratch buffer; the old one is retired (work already issued may still read it).
  void* ensure(Scratch& s, size_t bytes, const char* what, bool zeroed = false) {
    if (s.bytes >= bytes) return s.p;
    if (s.p) retired.push_back(s.p);
    const size_t nb = std::max(bytes, s.bytes * 3 / 2);
    s.p = device_alloc(nb, what);
    s.bytes = nb;
    if (zeroed) CUDA_CHECK(cudaMemsetAsync(s.p, 0, nb, stream));
    return s.p;
  }
  void* pinned_buf(size_t bytes) {
    if (pinned_bytes >= bytes) return pinned;
    if (pinned) {
      CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaFreeHost(pinned);
    }
    const size_t nb = std::max(bytes, size_t(1) << 20);
    CUDA_CHECK(cudaMallocHost(&pinned, nb));
    pinned_bytes = nb;
    return pinned;
  }
  // The `bytes` at device src, read back through the pinned staging buffer once what is recorded has run
  // (a sync point): valid until the staging buffer's next use.
  const void* read_back(const void* src, size_t bytes) {
    drain();
    void* pin = pinned_buf(bytes);
    CUDA_CHECK(cudaMemcpyAsync(pin, src, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return pin;
  }

  template <class T>
  const T* dev(const T* host) const {
    if (!host) return nullptr;
    auto it = consts.find(static_cast<const void*>(host));
    return it == consts.end() ? host : static_cast<const T*>(it->second.ptr);  // unknown: already device memory
  }
  const DevMatrix& matrix(const TernaryMatrix* w) const {
    auto it = mats.find(w);
    if (it == mats.end()) fail("CUDA backend: {} was not uploaded (prepare() the model first)", w->name);
    return it->second;
  }

  void upload_const(const void* host, size_t bytes, bool try_bf16_of_f32 = false) {
    if (!host || consts.count(host)) return;
    Const c;
    if (try_bf16_of_f32) {
      const float* f = static_cast<const float*>(host);
      const size_t n = bytes / 4;
      std::vector<uint16_t> b(n);
      bool exact = true;
      for (size_t i = 0; i < n && exact; ++i) {
        uint32_t u;
        std::memcpy(&u, &f[i], 4);
        b[i] = uint16_t(u >> 16);
        exact = (u & 0xffffu) == 0;
      }
      if (exact) {
        c.ptr = device_alloc(n * 2, "a dense projection");
        CUDA_CHECK(cudaMemcpy(c.ptr, b.data(), n * 2, cudaMemcpyHostToDevice));
        c.bf16 = true;
        owned.push_back(c.ptr);
        st.weight_bytes += n * 2;
        consts[host] = c;
        return;
      }
    }
    c.ptr = device_alloc(bytes, "a model constant");
    CUDA_CHECK(cudaMemcpy(c.ptr, host, bytes, cudaMemcpyHostToDevice));
    owned.push_back(c.ptr);
    st.weight_bytes += bytes;
    consts[host] = c;
  }

  void upload_matrix(const TernaryMatrix& w) {
    if (mats.count(&w)) return;
    if (w.cols % 128 != 0 || w.rows < 1) fail("CUDA backend: {} has K = {} (must be a positive multiple of 128)", w.name, w.cols);
    if (!w.blocks) fail("CUDA backend: {} has no weight blocks", w.name);
    // Device layout: words u32 [N, K/16] then (256-aligned) scales fp16 [N, K/128]. The canonical host form
    // is PQ2_0 blocks [N, K/128, 34] (often a view of the mapped pack), de-interleaved here a slice of
    // rows at a time through a bounded pinned staging buffer: no full host copy of the weights.
    const int64_t G = w.cols / 128;
    const size_t wpr = size_t(G) * 32, spr = size_t(G) * 2;  // word / scale bytes per row
    const size_t wb = size_t(w.rows) * wpr, sb = size_t(w.rows) * spr;
    const size_t soff = (wb + 255) / 256 * 256;
    // + kScaleTail zero bytes after the scales: GEMM v3's producer copies each row's scale as the 4-byte pair that holds
    // it, and the last scale of an odd N x G count starts the allocation's final pair.
    auto* base = static_cast<unsigned char*>(device_alloc(soff + sb + cuda::kScaleTail, w.name.c_str()));
    CUDA_CHECK(cudaMemsetAsync(base + soff + sb, 0, cuda::kScaleTail, stream));
    constexpr size_t kStaging = size_t(16) << 20;
    const int64_t slice = std::max<int64_t>(1, int64_t(kStaging / (wpr + spr)));  // rows per staging fill
    CUDA_CHECK(cudaStreamSynchronize(stream));  // nothing queued may still read the pinned buffer
    auto* stage = static_cast<unsigned char*>(pinned_buf(size_t(std::min<int64_t>(slice, w.rows)) * (wpr + spr)));
    for (int64_t r0 = 0; r0 < w.rows; r0 += slice) {
      const int64_t n = std::min<int64_t>(slice, w.rows - r0);
      unsigned char* sw = stage;                  // [n, K/16] u32
      unsigned char* ss = stage + size_t(n) * wpr;  // [n, K/128] fp16
      for (int64_t r = 0; r < n; ++r) {
        const uint8_t* row = w.row_blocks(r0 + r);  // [K/128, 34]: fp16 d, then the 32 code bytes (= 8 words)
        for (int64_t g = 0; g < G; ++g) {
          std::memcpy(sw + size_t(r) * wpr + size_t(g) * 32, row + g * 34 + 2, 32);
          std::memcpy(ss + size_t(r) * spr + size_t(g) * 2, row + g * 34, 2);
        }
      }
      CUDA_CHECK(cudaMemcpyAsync(base + size_t(r0) * wpr, sw, size_t(n) * wpr, cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaMemcpyAsync(base + soff + size_t(r0) * spr, ss, size_t(n) * spr, cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));  // the next slice overwrites the staging buffer
    }
    owned.push_back(base);
    st.weight_bytes += wb + sb + cuda::kScaleTail;
    if (!w.input_perm.empty()) upload_const(w.input_perm.data(), w.input_perm.size() * 4);
    mats[&w] = DevMatrix{reinterpret_cast<const uint32_t*>(base), reinterpret_cast<const uint16_t*>(base + soff), w.rows,
                         w.cols};
  }

  // ---- the site kernel with peephole fusion ----------------------------------------------------------
  // Options::norm_cluster: a norm of this many rows may wait for a site to fuse into (no warp site then).
  // Round 11: at prefill rows (the warp site) Options::site_norm_warp fuses it instead (site_norm_warp_kernel; the
  // same shape rule, site_cluster_shape_ok: K % 1024 == 0, at most 8 tiles, n <= 1024).
  bool norm_cluster_rows(int64_t rows) const {
    const bool warp = opt.site_warp && rows >= cuda::kSiteWarpMinRows;
    return warp ? opt.site_norm_warp : opt.norm_cluster > 0;
  }
  // Transforms (or just quantises, n = 1) x [rows, K] in place, fusing the producer ops at the tail of
  // the pending list. quantise: also write the int8 form and record it as the shadow of x.
  void site(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t n, bool inverse, bool quantise,
            bool may_defer = false) {
    cuda::SiteDesc d;
    d.warp = opt.site_warp;
    d.cluster = opt.norm_cluster;
    d.xpose = opt.site_xpose;
    d.rows_pipe = opt.site_rows_pipe;
    d.src = x;
    d.ld = K;
    d.dst = x;
    d.rows = rows;
    d.K = K;
    d.n = n;
    d.inverse = inverse;
    d.signs = dev(signs);
    const int64_t tile = n >= 1024 ? n : 1024;
    if (opt.fuse && !inverse) {
      const Pending* t = tail();
      if (t && t->kind == PK::Copy && t->dst == x && t->ld_dst == K && t->cols == K && t->rows == rows) {
        d.src = t->src;
        d.ld = t->ld_src;
        pend.pop_back();
      } else if (t && t->kind == PK::Permute && t->dst == x && t->rows == rows && t->cols == K) {
        d.src = t->src;
        d.perm = t->perm;
        pend.pop_back();
      }
      // A pre-op producing the (contiguous) source.
      t = tail();
      if (t && !d.perm && d.ld == K) {
        const int64_t n_el = rows * K;
        if (t->kind == PK::SiluMul && t->dst == d.src && t->cols == n_el) {
          d.pre = cuda::kPreSiluMul;
          d.src = t->src;
          d.src2 = t->src2;
          d.pre_out = t->dst;
          pend.pop_back();
        } else if (t->kind == PK::SigMul && t->dst == d.src && t->cols == n_el) {
          d.pre = cuda::kPreSigmoidMul;
          d.src2 = t->src2;
          d.pre_out = t->dst;
          pend.pop_back();
        } else if (t->kind == PK::Norm && t->dst == d.src && t->rows == rows && t->cols == K &&
                   K <= cuda::kMaxHadamardBlock && K % n == 0 && t->gain &&
                   (opt.fuse_norm || (norm_cluster_rows(rows) && cuda::site_cluster_shape_ok(K, n)))) {
          d.pre = cuda::kPreAddNorm;
          d.src = t->src;
          d.resid = t->dst2;
          d.gain = t->gain;
          d.eps = t->f;
          d.pre_out = t->dst;
          pend.pop_back();
          // Round 30: the delta is ffn_fused's chunk partials: the decode-row AddNorm site sums them itself.
          t = tail();
          if (t && t->kind == PK::Parts && t->dst == d.src && rows == 1 && quantise) {
            cuda::SiteDesc dp = d;
            dp.src = t->src;
            dp.nparts = int32_t(t->rows);
            dp.part_stride = t->cols;
            dp.levels = levels();
            dp.xq = reinterpret_cast<int8_t*>(16);  // (the supported check needs outputs; set below)
            dp.xds = reinterpret_cast<float2*>(16);
            if (opt.site_row_norm >= 1 && cuda::site_row_norm_supported(dp)) {
              d.src = dp.src;
              d.nparts = dp.nparts;
              d.part_stride = dp.part_stride;
              pend.pop_back();
            }
          }
        } else if (t->kind == PK::GNorm && t->dst == d.src && t->rows * t->cols == n_el && K % t->cols == 0 &&
                   tile % t->cols == 0) {
          d.pre = cuda::kPreGatedNorm;
          d.src = t->src;
          d.src2 = t->src2;
          d.gain = t->gain;
          d.seg = int32_t(t->cols);
          d.eps = t->f;
          d.pre_out = t->dst;
          pend.pop_back();
        }
      }
    }
    // Round 26: the gated norm of the held delta step's output, nothing pending between them: one launch.
    const bool with_delta = held_delta && !held_delta_site && pend.empty() && quantise && opt.site_row &&
                            d.pre == cuda::kPreGatedNorm && d.src == delta_desc.out && rows == 1;
    if (with_delta) held_delta = false;
    flush_pending();
    if (d.pre_out == d.dst) d.pre_out = nullptr;  // the site writes it anyway (n = 1, quantise only)
    // Quantise-only of x itself: x already holds the values, skip the fp32 write.
    if (quantise && n == 1 && !d.signs && d.pre == cuda::kPreNone && d.src == x && !d.perm) d.dst = nullptr;
    if (quantise) {
      if (K % 128 != 0) fail("CUDA backend: ternary input width {} is not a multiple of 128", K);
      d.levels = levels();
      d.xq = static_cast<int8_t*>(ensure(xq, size_t(rows * levels() * K), "the int8 activations"));
      d.xds = static_cast<float2*>(ensure(xds, size_t(rows * (K / 64)) * sizeof(float2), "the activation scales"));
      d.row_units = row_units_on();
      shadow = {x, rows, K, seq, cuda::site_row_units(d)};
    }
    // Held back for the matvec prologue: one row, int8 output, a pre-op the prologue knows, no gather.
    // The fused form does not write d.dst / d.pre_out: the forward reads a site's outputs only through
    // the linear that follows (checked by the tiny-pack model tests against the reference).
    // Round 11 (Options::site_prologue): q16 or q8, into matvec v7, AddNorm's residual and normed row included.
    const bool v1_site = opt.fuse_site && d.nparts == 1 && levels() == 1 && d.src != d.dst && cuda::matvec_site_supported(K, n, d.pre, d.seg);
    const bool v7_site = (opt.site_prologue == 1 || (opt.site_prologue > 1 && (opt.site_prologue >> (d.pre + 1)) & 1)) &&
                         opt.matvec == 6 && cuda::matvec7_site_supported(d);
    if (with_delta) {
      delta_desc.site = &d;
      if (cuda::delta_site_supported(delta_desc, d)) {
        delta_desc.site_count = static_cast<int32_t*>(
            ensure(delta_site_cnt, size_t(K / 1024) * 4, "fused delta-site counters", true));
        if (opt.delta_out) {  // round 31: held once more, for the out projection that reads the digits (linear)
          held_site_desc = d;
          delta_desc.site = nullptr;
          held_delta = held_delta_site = true;
          return;
        }
        emit(cuda::delta_launch(delta_desc));
        delta_desc.site = nullptr;
        return;
      }
      delta_desc.site = nullptr;
      emit(cuda::delta_launch(delta_desc));  // unfused: the step, then the site as below
    }
    if (may_defer && opt.fuse && !opt.exact && quantise && rows == 1 && !inverse && !d.perm && d.ld == K &&
        (v1_site || v7_site)) {
      deferred_site = true;
      site_desc = d;
      return;
    }
    emit(site_kernel_launch(d));
  }
  // x's int8 digits in xq / xds for a product reading x [rows, K]: quantised here (x unchanged) unless the site that
  // wrote x left them (the shadow) with no op since; a deferred site stays deferred (the product fuses or flushes it).
  void quantise_input(const float* x, int64_t rows, int64_t K) {
    const bool fresh = shadow.x == x && shadow.rows == rows && shadow.K == K && shadow.seq == seq;
    ++seq;
    if (!fresh) site(const_cast<float*>(x), rows, K, nullptr, 1, false, true, true);
  }
  // The site kernel for d: the decode-row sites (Options::site_row, site_row_norm) where they apply, else
  // site_launch's choice.
  cuda::Launch site_kernel_launch(const cuda::SiteDesc& d) const {
    if ((opt.site_row_norm == 2 || (opt.site_row_norm == 1 && d.rows == 1)) && cuda::site_row_norm_supported(d))
      return cuda::site_row_norm_launch(d, opt.site_row_norm_early);
    // Only the row-norm site sums chunk partials (site() folds them in only where it runs): any other would read
    // partial 0 as the whole delta.
    if (d.nparts > 1) fail("CUDA backend: a site over {} chunk partials needs the add + rmsnorm row site", d.nparts);
    return opt.site_row && cuda::site_row_supported(d) ? cuda::site_row_launch(d) : cuda::site_launch(d);
  }
};

// ---------------------------------------------------------------------------------------------------

CudaBackend::CudaBackend() : CudaBackend(Options{}) {}

CudaBackend::CudaBackend(const Options& o) : p_(std::make_unique<Impl>()) {
  if (!prefill_chunk_ok(o.prefill_chunk))
    fail("CUDA backend: prefill_chunk = {}: expected a multiple of 16 in 16..4096", o.prefill_chunk);
  p_->opt = o;
  if (const char* e = std::getenv("BONSAI_CUDA_MV7_TRACE"); e && *e) {  // diagnostic (Impl::trace_v7)
    if (cuda::matvec7_trace_compiled()) p_->trace_path = e;
    else std::fprintf(stderr, "BONSAI_CUDA_MV7_TRACE ignored: this build has no v7 timeline (-DBONSAI_V7_TRACE)\n");
  }
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    fail("CUDA backend: no CUDA device is available ({})",
         e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports 0 devices");
  }
  if (o.device < 0 || o.device >= n) fail("CUDA backend: device {} does not exist ({} device(s))", o.device, n);
  CUDA_CHECK(cudaSetDevice(o.device));
  CUDA_CHECK(cudaGetDeviceProperties(&p_->prop, o.device));
  if (p_->prop.major != 9)
    fail("CUDA backend: built for sm_90a (H100 / H200); device {} ({}) is sm_{}{}", o.device, p_->prop.name,
         p_->prop.major, p_->prop.minor);
  CUDA_CHECK(cudaStreamCreateWithFlags(&p_->stream, cudaStreamNonBlocking));
  cuda::init_kernel_attributes();
  cuda::init_matvec_wgmma_attributes();
}

CudaBackend::~CudaBackend() {
  if (!p_) return;
  if (p_->opt.profile && std::getenv("BONSAI_CUDA_PROFILE")) {  // the CLI's profile switch: report to stderr
    try {
      std::fprintf(stderr, "bonsai: CUDA kernel profile (eager launches, events around each)\n%s",
                   profile_report().c_str());
    } catch (...) {
    }
  }
  try {
    p_->sync();
    p_->write_trace();
  } catch (...) {
  }
  if (p_->trace_buf) cudaFree(p_->trace_buf);
  for (auto& g : p_->graphs) {
    cudaGraphExecDestroy(g.exec);
    cudaGraphDestroy(g.graph);
  }
  for (void* q : p_->owned) cudaFree(q);
  for (Impl::Scratch* s : {&p_->xq, &p_->xds, &p_->attn_o, &p_->attn_ml, &p_->attn_cnt, &p_->ids,
                           &p_->amr_out, &p_->amr_v, &p_->amr_i, &p_->amr_cnt, &p_->topk_out, &p_->gemm_part, &p_->mv6_part, &p_->mv6_cnt, &p_->site_cnt,
                           &p_->mvw_part, &p_->mvw_cnt, &p_->xh, &p_->delta_scratch, &p_->delta_site_cnt,
                           &p_->delta_conv_cnt, &p_->attn_planes, &p_->ffn_parts, &p_->ffn_cnt,
                           &p_->delta_out_parts, &p_->delta_out_flags})
    if (s->p) cudaFree(s->p);
  if (p_->pinned) cudaFreeHost(p_->pinned);
  for (cudaEvent_t e : p_->ev_pool) cudaEventDestroy(e);
  if (p_->stream) cudaStreamDestroy(p_->stream);
}

void CudaBackend::prepare(const Model& m) {
  Impl& I = *p_;
  uint64_t need = 0;
  for (const TernaryMatrix* w : m.ternary_matrices())
    if (!I.mats.count(w)) need += w->bytes();
  size_t fr = 0, tot = 0;
  CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
  if (need + (256u << 20) > fr)
    fail("CUDA backend: {} needs {:.2f} GB of device memory for its weights; {} has {:.2f} GB free of {:.2f} GB",
         m.source_path, double(need) / 1e9, I.prop.name, double(fr) / 1e9, double(tot) / 1e9);
  for (const TernaryMatrix* w : m.ternary_matrices()) I.upload_matrix(*w);
  I.head_words = I.matrix(&m.head).words;
  auto vec = [&](const std::vector<float>& v) {
    if (!v.empty()) I.upload_const(v.data(), v.size() * 4);
  };
  vec(m.out_norm);
  for (const LayerWeights& L : m.layers) {
    vec(L.attn_norm);
    vec(L.post_norm);
    if (L.full_attention) {
      vec(L.attn.q_norm);
      vec(L.attn.k_norm);
    } else {
      if (!L.gdn.a.empty()) I.upload_const(L.gdn.a.data(), L.gdn.a.size() * 4, true);
      if (!L.gdn.b.empty()) I.upload_const(L.gdn.b.data(), L.gdn.b.size() * 4, true);
      vec(L.gdn.A);
      vec(L.gdn.dt_bias);
      vec(L.gdn.conv);
      vec(L.gdn.norm);
    }
  }
  for (const auto& s : m.hadamard.signs)
    if (!s.empty()) I.upload_const(s.data(), s.size());
  CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaBackend::prepare_matrix(const TernaryMatrix& w) { p_->upload_matrix(w); }

void CudaBackend::release_matrix(const TernaryMatrix& w) {
  Impl& I = *p_;
  auto it = I.mats.find(&w);
  if (it == I.mats.end()) return;
  I.sync();
  void* base = const_cast<uint32_t*>(it->second.words);
  I.owned.erase(std::remove(I.owned.begin(), I.owned.end(), base), I.owned.end());
  I.st.weight_bytes -= w.bytes();
  cudaFree(base);
  I.mats.erase(it);
}
void CudaBackend::upload_constant(const void* host, size_t bytes, bool try_bf16) {
  p_->upload_const(host, bytes, try_bf16);
}

// ---- memory ---------------------------------------------------------------------------------------

float* CudaBackend::allocate(size_t n) {
  Impl& I = *p_;
  I.drain();
  auto* q = static_cast<float*>(I.device_alloc(n * sizeof(float), "an activation / state buffer"));
  CUDA_CHECK(cudaMemsetAsync(q, 0, std::max<size_t>(n, 1) * sizeof(float), I.stream));
  return q;
}

void CudaBackend::release(float* q) noexcept {
  if (!q) return;
  try {
    p_->sync();
  } catch (...) {
  }
  cudaFree(q);
}

void CudaBackend::zero(float* x, size_t n) {
  Impl& I = *p_;
  ++I.seq;
  I.flush_pending();
  I.emit(cuda::zero_launch(x, int64_t(n)));
}

void CudaBackend::copy_to_host(const float* src, size_t n, float* host) {
  Impl& I = *p_;
  I.drain();
  const size_t bytes = n * sizeof(float);
  if (bytes <= kPinnedMax) {
    std::memcpy(host, I.read_back(src, bytes), bytes);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, I.stream));
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
  }
}

void CudaBackend::copy_from_host(const float* host, size_t n, float* dst) {
  Impl& I = *p_;
  I.drain();
  const size_t bytes = n * sizeof(float);
  if (bytes <= kPinnedMax) {
    CUDA_CHECK(cudaStreamSynchronize(I.stream));  // the staging buffer may still feed an earlier copy
    void* pin = I.pinned_buf(bytes);
    std::memcpy(pin, host, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, pin, bytes, cudaMemcpyHostToDevice, I.stream));
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, I.stream));
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
  }
}

void CudaBackend::copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  Impl& I = *p_;
  ++I.seq;
  if (rows <= 0 || cols <= 0) return;
  Impl::Pending q{Impl::PK::Copy};
  q.dst = dst;
  q.src = src;
  q.ld_dst = rows == 1 ? cols : ld_dst;
  q.ld_src = rows == 1 ? cols : ld_src;
  q.rows = rows;
  q.cols = cols;
  I.defer(q);
}

void CudaBackend::scale(float* x, size_t n, float s) {
  Impl& I = *p_;
  ++I.seq;
  Impl::Pending q{Impl::PK::Scale};
  q.dst = x;
  q.cols = int64_t(n);
  q.f = s;
  I.defer(q);
}

// ---- embedding / rotation ----------------------------------------------------------------------------

void CudaBackend::embed_rows(const TernaryMatrix& table, const int32_t* host_ids, int64_t M, float* out) {
  Impl& I = *p_;
  // A decode step (one sequence, or a batched step of up to kInlineIds rows; prefill chunks of that size
  // too): record until the next sync point and replay a cached graph of the same shape.
  if (I.opt.graphs && M <= cuda::kInlineIds) I.begin_step();
  else I.flush_pending();
  ++I.seq;
  const Impl::DevMatrix& t = I.matrix(&table);
  const int32_t* ids_dev = nullptr;
  if (M > cuda::kInlineIds) {
    I.drain();
    auto* d = static_cast<int32_t*>(I.ensure(I.ids, size_t(M) * 4, "token ids"));
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
    void* pin = I.pinned_buf(size_t(M) * 4);
    std::memcpy(pin, host_ids, size_t(M) * 4);
    CUDA_CHECK(cudaMemcpyAsync(d, pin, size_t(M) * 4, cudaMemcpyHostToDevice, I.stream));
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
    ids_dev = d;
  }
  I.emit(cuda::embed_launch(t.words, t.scales, t.K, host_ids, ids_dev, M, out));
}

static void check_hadamard(int64_t K, int64_t block) {
  if (!is_pow2(block) || K % block != 0)
    fail("CUDA backend: Hadamard block {} must be a power of two dividing K = {}", block, K);
  if (block > cuda::kMaxHadamardBlock)
    fail("CUDA backend: Hadamard block {} exceeds the supported {}", block, cuda::kMaxHadamardBlock);
}

void CudaBackend::hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  Impl& I = *p_;
  check_hadamard(K, block);
  ++I.seq;
  I.site(x, rows, K, signs, block, false, K % 128 == 0, true);
}

void CudaBackend::hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) {
  Impl& I = *p_;
  check_hadamard(K, block);
  ++I.seq;
  I.site(x, rows, K, signs, block, true, false);
}

void CudaBackend::permute_cols(const float* x, int64_t rows, int64_t K, const int32_t* perm, float* out) {
  Impl& I = *p_;
  ++I.seq;
  Impl::Pending q{Impl::PK::Permute};
  q.dst = out;
  q.src = x;
  q.perm = I.dev(perm);
  q.rows = rows;
  q.cols = K;
  I.defer(q);
}

// ---- linear ---------------------------------------------------------------------------------------------

void CudaBackend::linear(const LinearOut* outs, int n_outs, int64_t K, const float* x, int64_t M) {
  Impl& I = *p_;
  if (n_outs < 1) fail("linear: {} outputs", n_outs);
  for (int i = 0; i < n_outs; ++i)
    if (outs[i].w->cols != K) fail("linear: {} has K = {}, the input has {}", outs[i].w->name, outs[i].w->cols, K);
  I.quantise_input(x, M, K);
  // Round 31: the held delta step's site wrote x's digits (nothing since): the step computes this product too.
  if (I.held_delta && I.held_delta_site && n_outs == 1 && M == 1 && !I.opt.exact && I.pend.empty() &&
      !I.deferred_site && I.shadow.x == x && I.delta_out_launch(outs[0], K))
    return;
  // The site producing x held back (one row): the matvec computes it as its prologue.
  cuda::SiteDesc site;
  // (Ops deferred after the site would run before the product that computes it: then the site runs first.)
  const bool fused = I.deferred_site && M == 1 && !I.opt.exact && I.pend.empty();
  if (fused) {
    site = I.site_desc;
    I.deferred_site = false;
  }
  I.flush_pending();
  const auto* xq = static_cast<const int8_t*>(I.xq.p);
  const auto* xds = static_cast<const float2*>(I.xds.p);
  for (int i0 = 0; i0 < n_outs; i0 += cuda::kMaxOuts) {
    cuda::TernaryDev t[cuda::kMaxOuts];
    const int n = std::min(cuda::kMaxOuts, n_outs - i0);
    for (int i = 0; i < n; ++i) {
      const Impl::DevMatrix& d = I.matrix(outs[i0 + i].w);
      t[i] = {d.words, d.scales, outs[i0 + i].y, d.N};
    }
    if (I.opt.exact) I.emit(cuda::exact_linear_launch(t, n, K, x, M));
    else {
      I.launches.clear();
      I.ternary_launches(t, n, K, xq, xds, M, fused ? &site : nullptr, I.launches);
      // Decode step: the previous matvec prefetches these weights into L2 when it is done (at most 3/4 of
      // L2, so the prefetched lines are not evicted by the prefetch itself).
      if (I.recording && M == 1 && I.opt.l2_prefetch && I.last_matvec >= 0 && size_t(I.last_matvec) < I.rec.size())
        cuda::matvec_set_prefetch(I.rec[size_t(I.last_matvec)], t, n, K, uint64_t(I.prop.l2CacheSize) * 3 / 4);
      if (!I.trace_path.empty() && I.recording && M == 1) I.trace_v7(I.launches, t, n, K);
      for (const cuda::Launch& l : I.launches) I.emit(l);
      // The index the launch got (-1 if a graph segment went out with it: it can no longer be patched).
      if (I.recording && M == 1 && I.opt.l2_prefetch)
        I.last_matvec = I.launches.size() == 1 && !I.rec.empty() ? int64_t(I.rec.size()) - 1 : -1;
    }
  }
}

void CudaBackend::dense_linear(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  Impl& I = *p_;
  ++I.seq;
  auto it = I.consts.find(w);
  const void* wd = it == I.consts.end() ? static_cast<const void*>(w) : it->second.ptr;
  const bool bf16 = it != I.consts.end() && it->second.bf16;
  if (I.opt.fuse && !I.pend.empty()) {
    Impl::Pending& t = I.pend.back();
    if (t.kind == Impl::PK::Dense && t.n_dense == 1 && t.src == x && t.cols == K && t.rows == M && t.bf16 == bf16) {
      t.dense[1] = {wd, y, N};
      t.n_dense = 2;
      return;
    }
  }
  Impl::Pending q{Impl::PK::Dense};
  q.dense[0] = {wd, y, N};
  q.n_dense = 1;
  q.src = x;
  q.cols = K;
  q.rows = M;
  q.bf16 = bf16;
  I.defer(q);
}

// ---- norms -------------------------------------------------------------------------------------------

void CudaBackend::rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) {
  Impl& I = *p_;
  ++I.seq;
  if (I.opt.fuse && gain && (I.opt.fuse_norm || (I.norm_cluster_rows(rows) && cuda::site_cluster_shape_ok(n, 1)))) {
    // fused into the site that reads out, if one does (else launched in order)
    Impl::Pending q{Impl::PK::Norm};
    q.dst = out;
    q.src = x;
    q.gain = I.dev(gain);
    q.rows = rows;
    q.cols = n;
    q.f = eps;
    I.defer(q);
    return;
  }
  I.flush_pending();
  I.emit(cuda::rmsnorm_launch(x, rows, n, I.dev(gain), eps, out));
}

void CudaBackend::add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                              float* out) {
  Impl& I = *p_;
  ++I.seq;
  if (I.opt.fuse && gain && (I.opt.fuse_norm || (I.norm_cluster_rows(rows) && cuda::site_cluster_shape_ok(n, 1)))) {
    Impl::Pending q{Impl::PK::Norm};
    q.dst = out;
    q.dst2 = h;
    q.src = delta;
    q.gain = I.dev(gain);
    q.rows = rows;
    q.cols = n;
    q.f = eps;
    I.defer(q);
    return;
  }
  I.flush_pending();
  I.emit(cuda::add_rmsnorm_launch(h, delta, rows, n, I.dev(gain), eps, out));
}

void CudaBackend::l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) {
  Impl& I = *p_;
  ++I.seq;
  Impl::Pending q{Impl::PK::L2};
  q.dst = x;
  q.rows = rows;
  q.cols = head_dim;
  q.f = eps;
  I.defer(q);
}

void CudaBackend::gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                                float* out) {
  Impl& I = *p_;
  ++I.seq;
  Impl::Pending q{Impl::PK::GNorm};
  q.dst = out;
  q.src = o;
  q.src2 = z;
  q.gain = I.dev(gain);
  q.rows = rows;
  q.cols = Dv;
  q.f = eps;
  I.defer(q);
}

// ---- attention ----------------------------------------------------------------------------------------

void CudaBackend::rope_neox(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t p0,
                            float theta) {
  Impl& I = *p_;
  ++I.seq;
  if (rot_dims % 2 != 0 || rot_dims > head_dim) fail("rope_neox: rot_dims {} vs head_dim {}", rot_dims, head_dim);
  I.flush_pending();
  if (rot_dims == 0) return;
  I.emit(cuda::rope_launch(x, M, n_heads, head_dim, rot_dims, p0, theta));
}

static void check_attention_shape(int64_t Hq, int64_t Hkv, int64_t D) {
  if (Hkv < 1 || Hq % Hkv != 0 || Hq / Hkv > cuda::kAttnMaxGroup || D % 32 != 0 || D > cuda::kAttnMaxDim)
    fail("CUDA backend: attention with Hq = {}, Hkv = {}, D = {} is not supported (Hq/Hkv <= {}, D a multiple of 32 "
         "<= {})",
         Hq, Hkv, D, cuda::kAttnMaxGroup, cuda::kAttnMaxDim);
}

void CudaBackend::attention(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0,
                            int64_t Hq, int64_t Hkv, int64_t D, float scale, float* out) {
  Impl& I = *p_;
  ++I.seq;
  check_attention_shape(Hq, Hkv, D);
  I.flush_pending();
  // Splits grow with the context, one per 64 positions (decode) / 256 (prefill) up to 32 (decode: 32 x Hkv
  // blocks of 8 warps fill the SMs at long contexts) / 16 (prefill: the M rows give the blocks). At M = 1
  // this changes the grid only every 64 tokens up to 2048: the decode graph is rebuilt then (cached by
  // shape), and the shortest contexts skip the cross-block merge entirely.
  const int64_t per = M == 1 ? 64 : 256;
  const int S = int(std::clamp<int64_t>((p0 + M + per - 1) / per, 1, M == 1 ? kDecodeSplits : kPrefillSplits));
  cuda::AttnDesc d{};
  d.q = q;
  d.k = k_cache;
  d.v = v_cache;
  d.out = out;
  d.M = M;
  d.p0 = p0;
  d.Hq = Hq;
  d.Hkv = Hkv;
  d.D = D;
  d.splits = S;
  d.scale = scale;
  d.pairs = I.opt.attn_pairs == 1 ? 1 : 2;
  // Options::attn_hsplit: 0 = the query heads of a KV head over several blocks at short contexts, 1 = off
  if (M == 1 && I.opt.attn_hsplit != 1)
    d.hsplit = cuda::attention_head_split(S, Hkv, Hq / Hkv, I.prop.multiProcessorCount);
  if (M == 1 && I.opt.attn_long) d.hsplit = cuda::attention_long_head_split(S, Hq / Hkv, d.hsplit);
  // Round 8b: 32 x 32 tiles for a prefill chunk (BONSAI_CUDA_ATTN=1 keeps the flash-decoding kernel); 4 rows per
  // thread by default (pp2048 3,828 vs 3,796 tok/s for 2, same run; docs/cuda-kernels.md round 8b).
  if (M > 1 && (I.opt.attn >= 2 || (I.opt.attn == 0 && M >= 16))) {
    if (I.opt.attn != 2 && I.opt.attn_prefill_mma != 0) {  // round 12: on the tensor cores
      if (I.opt.attn_planes && D % 8 == 0) {  // round 18: the window's f16 planes once per launch, not once per block
        const int64_t tp = p0 + M;
        void* planes = I.ensure(I.attn_planes, size_t(cuda::kv_planes_halves(tp, Hkv, D)) * 2, "attention K / V planes");
        I.emit(cuda::kv_planes_launch(d, planes, tp));
        I.emit(cuda::attention_prefill_mma_launch(d, I.opt.attn_prefill_mma == 1, planes, tp));
      } else {
        I.emit(cuda::attention_prefill_mma_launch(d, I.opt.attn_prefill_mma == 1));
      }
    } else
      I.emit(cuda::attention_prefill_launch(d, I.opt.attn == 2 ? 1 : 2));
    return;
  }
  I.emit_attention(d);
}

// ---- elementwise ----------------------------------------------------------------------------------------

void CudaBackend::swiglu_ffn(const TernaryMatrix& gate, const TernaryMatrix& up, const TernaryMatrix& down,
                             const float* x, int64_t M, float* fg, float* fu, float* delta, const int8_t* signs,
                             int64_t block) {
  Impl& I = *p_;
  const int64_t E = gate.cols, F = gate.rows, C = F / 1024;
  const int sms = I.prop.multiProcessorCount;
  cuda::FfnFusedDesc d;
  d.D = E;
  d.F = F;
  d.n = block;
  d.levels = I.levels();
  I.set_ffn_forms(d, sms);
  d.g = fg;
  d.u = fu;
  // The rule's shape half before anything is launched (the rest are pointers this op sets below).
  // The fused kernel is v7's product (its step and sum order): other batch-1 products keep the three launches.
  const bool v7 = I.opt.matvec == 6 && I.opt.matvec6_cfg == 0 && I.opt.matvec7 && I.opt.matvec6_split == 0;
  if (M != 1 || !I.opt.ffn_fused || !v7 || !I.opt.fuse || I.opt.exact || up.cols != E || up.rows != F || down.cols != F ||
      down.rows != E || !cuda::ffn_fused_shape_ok(d, sms) || !cuda::aligned16(fg) || !cuda::aligned16(fu)) {
    Backend::swiglu_ffn(gate, up, down, x, M, fg, fu, delta, signs, block);
    return;
  }
  I.quantise_input(x, M, E);
  I.flush_pending();  // a deferred site of x launched as a kernel: the fused FFN reads its digits
  const Impl::DevMatrix &g = I.matrix(&gate), &u = I.matrix(&up), &dn = I.matrix(&down);
  d.gate = {g.words, g.scales, nullptr, g.N};
  d.up = {u.words, u.scales, nullptr, u.N};
  d.down = {dn.words, dn.scales, nullptr, dn.N};
  d.xq = static_cast<const int8_t*>(I.xq.p);
  d.xds = static_cast<const float2*>(I.xds.p);
  d.signs = I.dev(signs);
  d.parts = static_cast<float*>(I.ensure(I.ffn_parts, size_t(C * E) * 4, "fused FFN partials"));
  d.count = static_cast<int32_t*>(I.ensure(I.ffn_cnt, size_t(2 * C) * 4, "fused FFN counters", true));
  if (I.opt.ffn_reduce) {  // round 37: the kernel sums the partials into delta itself
    d.y = delta;
    d.tile_count = static_cast<int32_t*>(I.ensure(I.ffn_tiles, size_t((E + 31) / 32) * 4, "fused FFN tile counters", true));
  }
  cuda::Launch l = cuda::ffn_fused_launch(d, sms);
  if (!I.trace_path.empty() && I.recording) I.trace_ffn(l, E, F);
  I.emit_with_parts(l, delta, d.y ? nullptr : d.parts, C, E);
}

void CudaBackend::sigmoid_gate_mul(float* x, const float* gate, int64_t n) {
  Impl& I = *p_;
  ++I.seq;
  Impl::Pending q{Impl::PK::SigMul};
  q.dst = x;
  q.src2 = gate;
  q.cols = n;
  I.defer(q);
}

void CudaBackend::silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  Impl& I = *p_;
  ++I.seq;
  Impl::Pending q{Impl::PK::SiluMul};
  q.dst = out;
  q.src = gate;
  q.src2 = up;
  q.cols = n;
  I.defer(q);
}

// ---- Gated DeltaNet --------------------------------------------------------------------------------------

void CudaBackend::gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc,
                           float* out) {
  Impl& I = *p_;
  ++I.seq;
  if (Kc < 1 || Kc > 8) fail("CUDA backend: conv kernel {} is not supported (1..8)", Kc);
  // A decode token's pending dense a/b pair (it reads the normed x, not the conv's input) shares the launch.
  const Impl::Pending* t = I.opt.fuse && I.opt.conv_dense && T == 1 ? I.tail() : nullptr;
  if (t && t->kind == Impl::PK::Dense && t->rows == 1 && t->dense[0].y != x && t->dense[1].y != x) {
    const Impl::Pending dn = *t;
    I.pend.pop_back();
    if (I.opt.delta_conv) {  // held for the delta step, which may compute both itself (emit_delta)
      Impl::Pending q = dn;
      q.kind = Impl::PK::ConvDense;
      q.dst = conv_state;
      q.dst2 = out;
      q.src2 = x;
      q.gain = I.dev(taps);
      q.ld_dst = C;
      q.ld_src = Kc;
      I.pend.push_back(q);
      return;
    }
    I.flush_pending();
    I.emit(cuda::gdn_conv_dense_launch(x, conv_state, I.dev(taps), C, Kc, out, dn.dense, dn.n_dense, dn.bf16, dn.cols,
                                       dn.src));
    return;
  }
  I.flush_pending();
  I.emit(cuda::gdn_conv_launch(x, conv_state, I.dev(taps), T, C, Kc, out));
}

void CudaBackend::gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                            float* g, float* beta) {
  Impl& I = *p_;
  ++I.seq;
  Impl::Pending q{Impl::PK::Gates};
  q.src = a;
  q.src2 = b;
  q.gain = I.dev(A);
  q.gain2 = I.dev(dt_bias);
  q.dst = g;
  q.dst2 = beta;
  q.rows = T;
  q.cols = Nv;
  I.defer(q);
}

// The delta rule launch for T tokens (one sequence) or T rows (rows != null), with the ops the forward
// issued just before it (gates, q scale, l2norm of q and k) folded into its prologue when fusion is on.
void CudaBackend::Impl::emit_delta(float* state, const cuda::RowTable* rows, const float* q, const float* k,
                                   const float* v, const float* g, const float* beta, int64_t T, int64_t Nk, int64_t Nv,
                                   int64_t Dk, int64_t Dv, float* out) {
  if (Nk < 1 || Nv % Nk != 0) fail("gdn: Nv = {} is not a multiple of Nk = {}", Nv, Nk);
  if (Dk > cuda::kDeltaMaxDk || Dk % 4 != 0 || Dv % 32 != 0)
    fail("CUDA backend: delta rule with Dk = {}, Dv = {} is not supported (Dk <= {} and a multiple of 4, Dv a "
         "multiple of 32)",
         Dk, Dv, cuda::kDeltaMaxDk);
  cuda::DeltaDesc d{};
  d.state = state;
  d.rows = rows;
  d.q = const_cast<float*>(q);
  d.k = const_cast<float*>(k);
  d.v = v;
  d.g = const_cast<float*>(g);
  d.beta = const_cast<float*>(beta);
  d.out = out;
  d.T = T;
  d.Nk = Nk;
  d.Nv = Nv;
  d.Dk = Dk;
  d.Dv = Dv;
  d.q_scale = 1.f;
  d.step_warps = opt.delta_step;
  d.ldq = d.ldk = Nk * Dk;  // packed rows unless the q / k / v copies fold below
  d.ldv = Nv * Dv;
  // Chunked WY form for a prefill chunk (one sequence, T > 1); round 8b: BONSAI_CUDA_DELTA=1 keeps the token loop.
  const bool chunked = !rows && Dk <= 128 && Dv <= 128 && (opt.delta == 2 || (opt.delta == 0 && T >= 16));
  if (opt.fuse) {
    const Pending* t = tail();
    if (t && t->kind == PK::Gates && t->dst == g && t->dst2 == beta && t->rows == T && t->cols == Nv) {
      d.a = t->src;
      d.b = t->src2;
      d.A = t->gain;
      d.dt_bias = t->gain2;
      pend.pop_back();
      t = tail();
    }
    if (t && t->kind == PK::Scale && t->dst == q && t->cols == T * Nk * Dk) {
      d.q_scale = t->f;
      pend.pop_back();
      t = tail();
    }
    for (int rep = 0; rep < 2; ++rep) {
      if (t && t->kind == PK::L2 && t->rows == T * Nk && t->cols == Dk && !d.l2_k && t->dst == k) {
        d.l2_k = 1;
        d.eps_k = t->f;
      } else if (t && t->kind == PK::L2 && t->rows == T * Nk && t->cols == Dk && !d.l2_q && t->dst == q) {
        // l2norm(q) before a fused scale is fine too: the kernel applies l2 first, then the scale.
        d.l2_q = 1;
        d.eps_q = t->f;
      } else {
        break;
      }
      pend.pop_back();
      t = tail();
    }
    // The q / k / v splits of the conv output (strided copies, M > 1): read in place with a row stride
    // instead (three fewer launches per GDN layer). The copies' destinations are then never written; the
    // forward reads them only here (as it reads q and k un-normalised after the l2 fusion above).
    for (int rep = 0; rep < 3 && t && t->kind == PK::Copy && t->rows == T && t->ld_dst == t->cols; ++rep) {
      // Each of q, k, v folds at most once (its pointer moves to the conv output when it does).
      if (t->dst == v && d.v == v && t->cols == Nv * Dv) {
        d.v = t->src;
        d.ldv = t->ld_src;
      } else if (t->dst == k && d.k == k && t->cols == Nk * Dk) {
        d.k = const_cast<float*>(t->src);
        d.ldk = t->ld_src;
      } else if (t->dst == q && d.q == q && t->cols == Nk * Dk) {
        d.q = const_cast<float*>(t->src);
        d.ldq = t->ld_src;
      } else {
        break;
      }
      pend.pop_back();
      t = tail();
    }
    // Round 29: a decode token's conv + a / b pair (held by gdn_conv) computed by the step itself. Its dense outputs
    // must be the gates' a / b folded above and its conv output the buffer q / k / v point into; the step must be
    // delta_step_kernel's (the chunked form, BONSAI_CUDA_DELTA=2 even at one token, has no conv of its own).
    if (t && t->kind == PK::ConvDense && opt.delta_conv && !chunked && !rows && T == 1 && t->n_dense == 2 && d.a &&
        t->dense[0].y == d.a && t->dense[1].y == d.b && t->dense[0].N == Nv && t->dense[1].N == Nv) {
      emit_held_delta();  // an earlier held step would read delta_conv_in, rewritten here (it goes first anyway)
      delta_conv_in = {};
      delta_conv_in.x = t->src2;
      delta_conv_in.state = t->dst;
      delta_conv_in.taps = t->gain;
      delta_conv_in.out = t->dst2;
      delta_conv_in.wa = t->dense[0].w;
      delta_conv_in.wb = t->dense[1].w;
      delta_conv_in.dx = t->src;
      delta_conv_in.C = t->ld_dst;
      delta_conv_in.Kc = t->ld_src;
      delta_conv_in.E = t->cols;
      delta_conv_in.bf16 = t->bf16;
      delta_conv_in.count = static_cast<int32_t*>(ensure(delta_conv_cnt, size_t(Nk) * 4, "fused delta-conv counters", true));
      if (cuda::delta_conv_supported(d, delta_conv_in)) {
        d.conv = &delta_conv_in;
        pend.pop_back();
      }
    }
  }
  flush_pending();
  if (chunked) {
    auto* scratch = static_cast<float*>(
        ensure(delta_scratch, cuda::delta_chunk_scratch_floats(T, Nv, Dk, Dv) * 4, "delta rule chunk scratch"));
    cuda::Launch l[2];
    cuda::delta_chunk_launches(d, scratch, opt.delta_mma, l);
    emit(l[0]);
    emit(l[1]);
    return;
  }
  d.rows_warps = opt.delta_rows;
  d.rows_split = opt.delta_rows_split;
  if (opt.fuse && opt.delta_site && !opt.exact && !rows && T == 1) {  // site() may fuse the gated-norm site into it
    held_delta = true;
    delta_desc = d;
    return;
  }
  emit(cuda::delta_launch(d));
}

void CudaBackend::gdn_delta_rule(float* state, const float* q, const float* k, const float* v, const float* g,
                                 const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                                 float* out) {
  ++p_->seq;
  p_->emit_delta(state, nullptr, q, k, v, g, beta, T, Nk, Nv, Dk, Dv, out);
}

// ---- batched decode ----------------------------------------------------------------------------------------

namespace {
// The inline table of a batched launch (M <= cuda::kMaxBatchRows, checked by the callers).
cuda::RowTable row_table(int64_t M, const int64_t* host_pos, float* const* a, float* const* b) {
  cuda::RowTable t{};
  for (int64_t m = 0; m < M; ++m) {
    t.pos[m] = host_pos ? host_pos[m] : 0;
    t.a[m] = a ? a[m] : nullptr;
    t.b[m] = b ? b[m] : nullptr;
  }
  return t;
}
}  // namespace

void CudaBackend::rope_neox_rows(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                                 const int64_t* host_pos, float theta) {
  if (M > cuda::kMaxBatchRows) return Backend::rope_neox_rows(x, M, n_heads, head_dim, rot_dims, host_pos, theta);
  Impl& I = *p_;
  ++I.seq;
  if (rot_dims % 2 != 0 || rot_dims > head_dim) fail("rope_neox: rot_dims {} vs head_dim {}", rot_dims, head_dim);
  I.flush_pending();
  if (rot_dims == 0) return;
  I.emit(cuda::rope_rows_launch(x, M, n_heads, head_dim, rot_dims, row_table(M, host_pos, nullptr, nullptr), theta));
}

void CudaBackend::kv_write_rows(float* const* k_caches, float* const* v_caches, const int64_t* host_pos, const float* k,
                                const float* v, int64_t M, int64_t row) {
  if (M > cuda::kMaxBatchRows) return Backend::kv_write_rows(k_caches, v_caches, host_pos, k, v, M, row);
  Impl& I = *p_;
  ++I.seq;
  I.flush_pending();
  I.emit(cuda::kv_write_rows_launch(row_table(M, host_pos, k_caches, v_caches), k, v, M, row));
}

void CudaBackend::attention_rows(const float* q, const float* const* k_caches, const float* const* v_caches,
                                 const int64_t* host_pos, int64_t M, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                                 float* out) {
  if (M > cuda::kMaxBatchRows) return Backend::attention_rows(q, k_caches, v_caches, host_pos, M, Hq, Hkv, D, scale, out);
  Impl& I = *p_;
  ++I.seq;
  check_attention_shape(Hq, Hkv, D);
  I.flush_pending();
  int64_t longest = 0;
  for (int64_t m = 0; m < M; ++m) longest = std::max(longest, host_pos[m] + 1);
  // One split count for the batch, from its longest row (rows shorter than a split leave it empty).
  const int S = int(std::clamp<int64_t>((longest + 63) / 64, 1, kDecodeSplits));
  const cuda::RowTable t =
      row_table(M, host_pos, const_cast<float* const*>(k_caches), const_cast<float* const*>(v_caches));
  cuda::AttnDesc d{};
  d.q = q;
  d.out = out;
  d.M = M;
  d.Hq = Hq;
  d.Hkv = Hkv;
  d.D = D;
  d.splits = S;
  d.scale = scale;
  d.pairs = I.opt.attn_pairs == 1 ? 1 : 2;
  d.rows = &t;
  I.emit_attention(d);
}

void CudaBackend::attention_prep(const AttnPrep& a) {
  Impl& I = *p_;
  if (!I.opt.fuse || !I.opt.attn_prep || !cuda::attn_prep_supported(a.Dh, a.rot_dims) || (a.pos && a.M > cuda::kMaxBatchRows))
    return Backend::attention_prep(a);
  ++I.seq;
  I.flush_pending();
  cuda::AttnPrepDesc d{};
  d.q_gate = a.q_gate;
  d.q = a.q;
  d.gate = a.gate;
  d.k = a.k;
  d.v = a.v;
  d.q_gain = I.dev(a.q_gain);
  d.k_gain = I.dev(a.k_gain);
  d.k_cache = a.k_cache;
  d.v_cache = a.v_cache;
  d.M = a.M;
  d.H = a.H;
  d.Hkv = a.Hkv;
  d.Dh = a.Dh;
  d.rot = a.rot_dims;
  d.p0 = a.p0;
  d.eps = a.eps;
  d.theta = a.theta;
  cuda::RowTable t;
  if (a.pos) {
    t = row_table(a.M, a.pos, a.k_caches, a.v_caches);
    d.rows = &t;
  }
  I.emit(cuda::attn_prep_launch(d));
}

void CudaBackend::gdn_conv_rows(const float* x, float* const* conv_states, const float* taps, int64_t M, int64_t C,
                                int64_t Kc, float* out) {
  if (M > cuda::kMaxBatchRows) return Backend::gdn_conv_rows(x, conv_states, taps, M, C, Kc, out);
  Impl& I = *p_;
  ++I.seq;
  if (Kc < 1 || Kc > 8) fail("CUDA backend: conv kernel {} is not supported (1..8)", Kc);
  // Round 22: the pending a / b pair of the same rows (it reads the normed x, not the conv's input) shares the launch,
  // as at one token (M <= 32: dense_launch's row-per-block form).
  const Impl::Pending* t = I.opt.fuse && I.opt.conv_dense ? I.tail() : nullptr;
  if (t && t->kind == Impl::PK::Dense && t->rows == M && M <= 32 && t->dense[0].y != x && t->dense[1].y != x) {
    const Impl::Pending dn = *t;
    I.pend.pop_back();
    I.flush_pending();
    I.emit(cuda::gdn_conv_dense_rows_launch(x, row_table(M, nullptr, conv_states, nullptr), I.dev(taps), M, C, Kc, out,
                                            dn.dense, dn.n_dense, dn.bf16, dn.cols, dn.src));
    return;
  }
  I.flush_pending();
  I.emit(cuda::gdn_conv_rows_launch(x, row_table(M, nullptr, conv_states, nullptr), I.dev(taps), M, C, Kc, out));
}

void CudaBackend::gdn_delta_rule_rows(float* const* states, const float* q, const float* k, const float* v,
                                      const float* g, const float* beta, int64_t M, int64_t Nk, int64_t Nv, int64_t Dk,
                                      int64_t Dv, float* out) {
  if (M > cuda::kMaxBatchRows) return Backend::gdn_delta_rule_rows(states, q, k, v, g, beta, M, Nk, Nv, Dk, Dv, out);
  ++p_->seq;
  const cuda::RowTable t = row_table(M, nullptr, states, nullptr);
  p_->emit_delta(nullptr, &t, q, k, v, g, beta, M, Nk, Nv, Dk, Dv, out);
}

// ---- extras ------------------------------------------------------------------------------------------------

bool CudaBackend::argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* host_out) {
  Impl& I = *p_;
  ++I.seq;
  if (rows < 1 || n < 1 || n > INT32_MAX) fail("argmax_rows: {} rows of {} (want >= 1 rows of 1..{})", rows, n, INT32_MAX);
  I.flush_pending();
  auto* out = static_cast<int32_t*>(I.ensure(I.amr_out, size_t(rows) * 4, "argmax rows"));
  const int C = cuda::argmax_rows_chunks(rows, n, I.prop.multiProcessorCount);
  float* pv = nullptr;
  int64_t* pi = nullptr;
  int32_t* cnt = nullptr;
  if (C > 1) {
    pv = static_cast<float*>(I.ensure(I.amr_v, size_t(rows * C) * 4, "argmax rows"));
    pi = static_cast<int64_t*>(I.ensure(I.amr_i, size_t(rows * C) * 8, "argmax rows"));
    cnt = static_cast<int32_t*>(I.ensure(I.amr_cnt, size_t(rows) * 4, "argmax rows", true));
  }
  I.emit(cuda::argmax_rows_launch(x, rows, n, out, C, pv, pi, cnt));  // part of the step's graph when one is recorded
  std::memcpy(host_out, I.read_back(out, size_t(rows) * 4), size_t(rows) * 4);  // the sync point launches it
  return true;
}

int64_t CudaBackend::top_k(float* x, int64_t n, int32_t k, float penalty, const int32_t* penalized,
                           int64_t n_penalized, int32_t* ids, float* values) {
  if (k < 1 || k > cuda::kMaxTopK || n_penalized > cuda::kMaxTopKPenalized || n < 1 || n > INT32_MAX) return -1;
  Impl& I = *p_;
  ++I.seq;
  I.flush_pending();
  const size_t bytes = size_t(1 + 2 * k) * 4;  // count | ids [k] | values [k]
  auto* out = static_cast<int32_t*>(I.ensure(I.topk_out, bytes, "top-k"));
  I.emit(cuda::top_k_launch(x, n, k, penalty, penalized, int32_t(n_penalized), out));  // into the step's graph
  const auto* pin = static_cast<const int32_t*>(I.read_back(out, bytes));
  const int64_t count = pin[0], m = std::min<int64_t>(k, count);
  std::memcpy(ids, pin + 1, size_t(m) * 4);
  std::memcpy(values, pin + 1 + k, size_t(m) * 4);
  return count;
}

int64_t CudaBackend::argmax(const float* x, int64_t n) {
  int32_t i = 0;
  argmax_rows(x, 1, n, &i);  // one row: up to 64 blocks, the last merges (argmax_rows_kernel)
  return i;
}

void CudaBackend::synchronize() { p_->sync(); }

void CudaBackend::set_options(const Options& o) {
  p_->sync();
  const int dev = p_->opt.device;
  p_->opt = o;
  p_->opt.device = dev;
  p_->shadow = {};  // a quantised activation of the old options (digit count) must not be reused
}
CudaBackend::Options CudaBackend::options() const { return p_->opt; }
int64_t CudaBackend::prefill_chunk() const { return p_->opt.prefill_chunk; }

bool CudaBackend::row_quantised(int64_t rows, int64_t K) const {
  // linear()'s quantise-only site (Impl::site with n = 1, no signs, no pre-op) on 16-byte aligned buffers
  alignas(16) static int8_t dummy[16];
  cuda::SiteDesc d;
  d.warp = p_->opt.site_warp;
  d.row_units = p_->row_units_on();
  d.src = reinterpret_cast<const float*>(dummy);
  d.xq = dummy;
  d.ld = d.K = K;
  d.rows = rows;
  d.n = 1;
  return cuda::site_row_units(d);
}

CudaBackend::Stats CudaBackend::stats() const { return p_->st; }

namespace {
// "_ZN6bonsai4cuda<anon ns>11site_kernelENS1_8SiteArgsE" -> "site_kernel": the last name of the mangled nested
// name; a template keeps its arguments up to the first 'E' ("matvec6l_kernelILi2"), so instantiations stay apart.
// At most 44 chars. (A list of known names matched by substring mislabelled head_norm_kernel as norm_kernel and
// conv_dense_kernel as dense_kernel.)
std::string short_kernel_name(const void* func) {
  const char* name = nullptr;
  if (cudaFuncGetName(&name, func) != cudaSuccess || !name) {
    cudaGetLastError();
    name = "?";
  }
  std::string n = name;
  if (n.rfind("_ZN", 0) == 0) {
    size_t i = 3, last = std::string::npos;  // last: where the last <length><identifier> starts its identifier
    while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) {
      size_t len = 0;
      while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) len = len * 10 + size_t(n[i++] - '0');
      last = i;
      i += len;
    }
    if (last < n.size()) n = n.substr(last, n.find('E', last) - last);
  }
  return n.size() > 44 ? n.substr(0, 44) : n;
}
}  // namespace

std::string CudaBackend::profile_report() {
  Impl& I = *p_;
  I.sync();
  std::vector<std::pair<const void*, std::pair<int64_t, double>>> v(I.prof_acc.begin(), I.prof_acc.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  double total = 0;
  for (const auto& e : v) total += e.second.second;
  std::string out = fmt::format("{:<44} {:>8} {:>10} {:>9} {:>6}\n", "kernel", "launches", "total ms", "mean us", "%");
  for (const auto& e : v)
    out += fmt::format("{:<44} {:>8} {:>10.3f} {:>9.2f} {:>6.1f}\n", short_kernel_name(e.first), e.second.first,
                       e.second.second, 1e3 * e.second.second / double(e.second.first), 100.0 * e.second.second / total);
  out += fmt::format("{:<44} {:>8} {:>10.3f}\n", "total", "", total);
  // BONSAI_CUDA_PROFILE=2: also the launch order of the last batch between two host syncs (a decode step).
  if (const char* e = std::getenv("BONSAI_CUDA_PROFILE"); e && std::string(e) == "2") {
    out += fmt::format("launch order of the last synchronised batch ({} launches): index kernel us\n", I.prof_last.size());
    for (size_t i = 0; i < I.prof_last.size(); ++i)
      out += fmt::format("{:>5} {:<44} {:>9.2f}\n", i, short_kernel_name(I.prof_last[i].first),
                         1e3 * I.prof_last[i].second);
  }
  I.prof_acc.clear();
  return out;
}
std::string CudaBackend::device_name() const { return p_->prop.name; }
int CudaBackend::sm_count() const { return p_->prop.multiProcessorCount; }
uint64_t CudaBackend::device_free_bytes() const {
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  return f;
}
uint64_t CudaBackend::device_total_bytes() const {
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  return t;
}

CudaBackend::SyncCosts CudaBackend::probe_sync_us(int launches, int rounds) {
  Impl& I = *p_;
  I.sync();
  static const bool attr = (cuda::init_sync_probe_attributes(), true);
  (void)attr;
  const int blocks = I.prop.multiProcessorCount;
  auto* count = static_cast<int32_t*>(I.device_alloc(4, "the sync probe"));
  auto best = [](const std::vector<float>& ms) { return double(*std::min_element(ms.begin(), ms.end())); };
  SyncCosts c;
  // The hops: one captured graph of empty dependent kernels (as the decode step's graph holds its launches); the best
  // of 3 runs after one warm-up.
  const std::vector<cuda::Launch> hops(size_t(launches), cuda::sync_probe_hop_launch(count, blocks, cuda::kSyncProbeSmem));
  cudaGraphExec_t ge = I.capture_launches(hops, true);
  c.hop_us = best(I.timed_runs_ms(1, 3, [&] { CUDA_CHECK(cudaGraphLaunch(ge, I.stream)); })) * 1000.0 / launches;
  cudaGraphExecDestroy(ge);
  // The barriers: one kernel, the counter zeroed before each run (the 4-byte memset is inside the timed region).
  c.barrier_us = best(I.timed_runs_ms_eager(1, 3, [&] {
                   CUDA_CHECK(cudaMemsetAsync(count, 0, 4, I.stream));
                   I.launch_now(cuda::sync_probe_barrier_launch(count, rounds, blocks, cuda::kSyncProbeSmem));
                 })) *
                 1000.0 / rounds;
  cudaFree(count);
  return c;
}

double CudaBackend::probe_wgmma_tops(int mode, int groups) {
  Impl& I = *p_;
  I.sync();
  static const bool attr = (cuda::init_wgmma_probe_attributes(), true);
  (void)attr;
  const int blocks = I.prop.multiProcessorCount;
  auto* sink = static_cast<float*>(I.device_alloc(size_t(blocks) * 256 * 4, "the wgmma probe"));
  const cuda::Launch l = cuda::wgmma_probe_launch(mode, sink, blocks, groups);
  const std::vector<float> ms = I.timed_runs_ms_eager(1, 3, [&] { I.launch_now(l); });
  cudaFree(sink);
  // per block and group: 2 consumers x 8 wgmmas x 64 x 128 x 32 MACs x 2 ops
  const double ops = double(blocks) * groups * 2.0 * 8 * 64 * 128 * 32 * 2;
  return ops / (double(*std::min_element(ms.begin(), ms.end())) * 1e-3) / 1e12;
}

double CudaBackend::probe_read_gbs(uint64_t bytes, int reps) {
  Impl& I = *p_;
  I.sync();
  bytes = bytes / 16 * 16;
  void* buf = I.device_alloc(bytes, "the bandwidth probe");
  const int blocks = I.prop.multiProcessorCount * 4;
  uint32_t* sink = static_cast<uint32_t*>(I.device_alloc(size_t(blocks) * 4, "the bandwidth probe"));
  CUDA_CHECK(cudaMemsetAsync(buf, 0x5A, bytes, I.stream));
  const cuda::Launch l = cuda::probe_launch(buf, int64_t(bytes / 16), sink, blocks);
  std::vector<float> ms = I.timed_runs_ms_eager(1, reps, [&] { I.launch_now(l); });
  cudaFree(buf);
  cudaFree(sink);
  std::sort(ms.begin(), ms.end());
  return double(bytes) / (double(ms[ms.size() / 2]) * 1e-3) / 1e9;
}

// The measurement helpers' round of products: launch i = mats[i n_outs .. i n_outs + n_outs) times one random
// activation x [M, K] (quantised by one site launch here), writing a scratch y. The caller releases x and y.
std::vector<cuda::Launch> CudaBackend::product_round(const TernaryMatrix* const* mats, int n_mats, int n_outs, int64_t M,
                                                     float*& x, float*& y) {
  Impl& I = *p_;
  I.sync();
  const int64_t K = mats[0]->cols;
  int64_t maxN = 0;
  for (int i = 0; i < n_mats; ++i) maxN = std::max(maxN, mats[i]->rows);
  std::vector<float> hx(size_t(M * K));
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : hx) v = nd(rng);
  x = allocate(size_t(M * K));
  y = allocate(size_t(M * maxN * n_outs));
  copy_from_host(hx.data(), hx.size(), x);
  I.site(x, M, K, nullptr, 1, false, true);
  const auto* xq = static_cast<const int8_t*>(I.xq.p);
  const auto* xds = static_cast<const float2*>(I.xds.p);
  std::vector<cuda::Launch> ls;
  for (int i = 0; i + n_outs <= n_mats; i += n_outs) {
    cuda::TernaryDev t[cuda::kMaxOuts];
    for (int j = 0; j < n_outs; ++j) {
      const Impl::DevMatrix& d = I.matrix(mats[i + j]);
      t[j] = {d.words, d.scales, y + j * M * maxN, d.N};
    }
    I.ternary_launches(t, n_outs, K, xq, xds, M, nullptr, ls);
  }
  return ls;
}

double CudaBackend::time_linear_kernel(const TernaryMatrix* const* mats, int n_mats, int n_outs, int64_t M, int reps,
                                       bool pdl_between) {
  Impl& I = *p_;
  float *x = nullptr, *y = nullptr;
  const std::vector<cuda::Launch> ls = product_round(mats, n_mats, n_outs, M, x, y);
  // One round = every launch once, captured as a graph, with or without programmatic edges between them.
  CUDA_CHECK(cudaStreamSynchronize(I.stream));
  cudaGraphExec_t ge = I.capture_launches(ls, pdl_between);
  std::vector<float> ms = I.timed_runs_ms(2, reps, [&] { CUDA_CHECK(cudaGraphLaunch(ge, I.stream)); });
  cudaGraphExecDestroy(ge);
  release(x);
  release(y);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3 / double(n_mats / n_outs);  // per product (split-K: GEMM + its sum)
}

std::vector<uint64_t> CudaBackend::trace_linear_kernel(const TernaryMatrix* const* mats, int n_mats, int n_outs,
                                                       int64_t M, int& blocks) {
  Impl& I = *p_;
  float *x = nullptr, *y = nullptr;
  std::vector<cuda::Launch> ls = product_round(mats, n_mats, n_outs, M, x, y);
  blocks = ls.empty() ? 0 : int(ls[0].grid.x);
  const size_t per = size_t(blocks) * cuda::kV7TraceSlots;
  std::vector<uint64_t> out(per * ls.size(), 0);
  auto* buf = static_cast<uint64_t*>(I.device_alloc(out.size() * 8 + 8, "v7 timeline"));
  CUDA_CHECK(cudaMemsetAsync(buf, 0, out.size() * 8, I.stream));
  for (size_t i = 0; i < ls.size() && !out.empty(); ++i)  // every launch v7 with one grid, or no trace
    if (ls[i].grid.x != unsigned(blocks) || !cuda::matvec7_set_trace(ls[i], buf + i * per)) out.clear();
  if (!out.empty()) {
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
    cudaGraphExec_t ge = I.capture_launches(ls, true);
    for (int r = 0; r < 3; ++r) CUDA_CHECK(cudaGraphLaunch(ge, I.stream));
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
    cudaGraphExecDestroy(ge);
    CUDA_CHECK(cudaMemcpy(out.data(), buf, out.size() * 8, cudaMemcpyDeviceToHost));
  }
  cudaFree(buf);
  release(x);
  release(y);
  return out;
}

CudaBackend::FfnKernelRun CudaBackend::run_ffn_kernel(const TernaryMatrix* const* mats, int n_ffn, const float* x,
                                                      const int8_t* signs, int64_t n, bool fused, int reps, int phases) {
  Impl& I = *p_;
  I.sync();
  FfnKernelRun out;
  const int64_t F = mats[0]->rows, D = mats[0]->cols, C = F / 1024;
  const int lv = I.levels(), sms = I.prop.multiProcessorCount;
  float* xd = allocate(size_t(D));                             // [D] the input row
  float* gu = allocate(size_t(2 * F));                         // [2, F] gate rows, up rows
  float* y = allocate(size_t(D));                              // [D] ffn_down's output (unfused)
  float* parts = allocate(size_t(std::max<int64_t>(C, 1) * D));  // [C, D] chunk partials (fused)
  float* xq2 = allocate(size_t((lv * F + 3) / 4));             // int8 [lv, F] the down input's digits (unfused)
  float* xds2 = allocate(size_t(F / 32));                      // float2 [F/64]
  const int64_t n_cnt = std::max<int64_t>(2 * C, 1) + (I.opt.ffn_reduce ? (D + 31) / 32 : 0);
  float* cnt = allocate(size_t(n_cnt));  // int32 [2C] the fused kernel's group counters, then its tile counters
  float* sg = signs ? allocate(size_t((F + 3) / 4)) : nullptr;  // int8 [F]
  zero(cnt, size_t(n_cnt));
  auto poison = [&](float* q, int64_t n) { CUDA_CHECK(cudaMemsetAsync(q, 0xff, size_t(n) * 4, I.stream)); };  // NaN
  poison(gu, 2 * F);  // a row no kernel writes shows
  poison(y, D);
  poison(parts, std::max<int64_t>(C, 1) * D);
  copy_from_host(x, size_t(D), xd);
  if (sg) CUDA_CHECK(cudaMemcpyAsync(sg, signs, size_t(F), cudaMemcpyHostToDevice, I.stream));
  I.site(xd, 1, D, nullptr, 1, false, true);  // x's digits into I.xq / I.xds
  I.flush_pending();
  const auto* xq = static_cast<const int8_t*>(I.xq.p);
  const auto* xds = static_cast<const float2*>(I.xds.p);
  std::vector<cuda::Launch> ls;
  for (int f = 0; f < n_ffn; ++f) {
    const Impl::DevMatrix &g = I.matrix(mats[3 * f]), &u = I.matrix(mats[3 * f + 1]), &dn = I.matrix(mats[3 * f + 2]);
    if (fused) {
      cuda::FfnFusedDesc d;
      d.gate = {g.words, g.scales, nullptr, g.N};
      d.up = {u.words, u.scales, nullptr, u.N};
      d.down = {dn.words, dn.scales, nullptr, dn.N};
      d.xq = xq;
      d.xds = xds;
      d.g = gu;
      d.u = gu + F;
      d.signs = reinterpret_cast<const int8_t*>(sg);
      d.parts = parts;
      d.count = reinterpret_cast<int32_t*>(cnt);
      if (I.opt.ffn_reduce) {
        d.y = y;
        d.tile_count = reinterpret_cast<int32_t*>(cnt) + std::max<int64_t>(2 * C, 1);
      }
      d.D = D;
      d.F = F;
      d.n = n;
      d.levels = lv;
      I.set_ffn_forms(d, sms);
      d.phases = phases;
      if (!cuda::ffn_fused_supported(d, sms)) break;
      ls.push_back(cuda::ffn_fused_launch(d, sms));
    } else {
      const cuda::TernaryDev t[2] = {{g.words, g.scales, gu, g.N}, {u.words, u.scales, gu + F, u.N}};
      I.ternary_launches(t, 2, D, xq, xds, 1, nullptr, ls);
      cuda::SiteDesc sd;
      sd.warp = I.opt.site_warp;
      sd.rows_pipe = I.opt.site_rows_pipe;
      sd.src = gu;
      sd.src2 = gu + F;
      sd.pre = cuda::kPreSiluMul;
      sd.signs = reinterpret_cast<const int8_t*>(sg);
      sd.ld = F;
      sd.rows = 1;
      sd.K = F;
      sd.n = n;
      sd.levels = lv;
      sd.xq = reinterpret_cast<int8_t*>(xq2);
      sd.xds = reinterpret_cast<float2*>(xds2);
      ls.push_back(I.site_kernel_launch(sd));
      const cuda::TernaryDev td = {dn.words, dn.scales, y, dn.N};
      I.ternary_launches(&td, 1, F, reinterpret_cast<const int8_t*>(xq2), reinterpret_cast<const float2*>(xds2), 1,
                         nullptr, ls);
    }
  }
  if (int(ls.size()) >= n_ffn) {
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
    cudaGraphExec_t ge = I.capture_launches(ls, true);
    CUDA_CHECK(cudaGraphLaunch(ge, I.stream));
    CUDA_CHECK(cudaStreamSynchronize(I.stream));
    out.ran = true;
    out.gu = std::vector<float>(size_t(2 * F));
    copy_to_host(gu, out.gu.size(), out.gu.data());
    out.y = std::vector<float>(size_t(D), 0.f);
    if (fused) {
      out.counters = std::vector<int32_t>(size_t(n_cnt));  // (C >= 1: the kernel ran)
      CUDA_CHECK(cudaMemcpy(out.counters.data(), cnt, out.counters.size() * 4, cudaMemcpyDeviceToHost));
      std::vector<float> p(size_t(C * D));
      copy_to_host(parts, p.size(), p.data());
      out.parts_sum = std::vector<float>(size_t(D), 0.f);
      for (int64_t i = 0; i < D; ++i) {  // the AddNorm site's order: chunk 0, then + chunk 1, ...
        float v = p[size_t(i)];
        for (int64_t c = 1; c < C; ++c) v += p[size_t(c * D + i)];
        out.parts_sum[size_t(i)] = v;
      }
      if (I.opt.ffn_reduce) copy_to_host(y, out.y.size(), out.y.data());
      else out.y = out.parts_sum;
    } else {
      copy_to_host(y, out.y.size(), out.y.data());
    }
    if (reps > 0) {
      std::vector<float> ms = I.timed_runs_ms(2, reps, [&] { CUDA_CHECK(cudaGraphLaunch(ge, I.stream)); });
      std::sort(ms.begin(), ms.end());
      out.us = double(ms[ms.size() / 2]) * 1e3 / double(n_ffn);
    }
    cudaGraphExecDestroy(ge);
  }
  for (float* q : {xd, gu, y, parts, xq2, xds2, cnt, sg})
    if (q) release(q);
  return out;
}

}  // namespace bonsai
