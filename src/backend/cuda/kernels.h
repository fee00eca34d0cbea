// Launch builders for every kernel of the CUDA backend. Each returns a Launch record (launch.h) that the
// backend either launches at once or appends to a decode-step graph. Plain C++ (no CUDA syntax), so the
// backend's host logic (cuda_backend.cpp) is compiled by the host compiler.
//
// Conventions: every pointer is device memory; shapes [A, B] are row-major and contiguous unless a
// leading dimension is given; fp32 activations. Kernels are written for sm_90 and use programmatic
// dependent launch: each one lets the next kernel launch early and waits for its predecessor before
// touching activations (the ternary kernels stream their weights before that wait).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/launch.h"

namespace bonsai::cuda {

// Host side (the launch rules here and the backend's): may a kernel read / write p with 16-byte vector accesses?
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- activation site: pre-op -> gather -> sign/FWHT -> dst (+ int8 quantisation) -------------------
// value[r][i]   = pre(src[r*ld + i], src2[r*ld + i])      pre: None (src), SiluMul silu(src)*src2,
//                                                          SigmoidMul src*sigmoid(src2),
//                                                          GatedNorm rmsnorm_seg(src)*gain[i%seg]*silu(src2)
// pre_out[r*ld + i] = value (when pre_out is set: the pre-op's own output buffer, kept exact)
// gathered[r][i] = value[r][perm[i]] when perm is set (pre must be elementwise then)
// dst[r][i]      = forward: FWHT_n(signs ⊙ gathered)/sqrt(n); inverse: signs ⊙ FWHT_n(gathered)/sqrt(n)
//                  (n = 1: no transform, signs still applied)
// xq, xds        = the integer form the ternary kernels read (below), when xq is set (forward / n = 1 only):
//                  `levels` int8 digits per element (1: q8, 2: q16; layout in ternary.cu's header)
// dst may equal src (no gather) or be null (quantise only); n power of two <= 8192; K % n == 0; quantisation needs K % 128 == 0.
//                                                          AddNorm rmsnorm(src + resid) * gain[i] over the
//                                                          whole row; resid (if set) = src + resid. One block
//                                                          per row (K <= kMaxHadamardBlock, no perm): the
//                                                          add_rmsnorm / rmsnorm before a site, fused.
enum PreOp : int32_t { kPreNone = 0, kPreSiluMul = 1, kPreSigmoidMul = 2, kPreGatedNorm = 3, kPreAddNorm = 4 };
struct SiteDesc {
  const float* src = nullptr;    // [rows, ld]
  const float* src2 = nullptr;   // [rows, ld] second operand of the pre-op
  const float* gain = nullptr;   // [seg] GatedNorm gain
  float* pre_out = nullptr;      // [rows, ld] or null
  float* resid = nullptr;        // [rows, ld] AddNorm residual (updated in place) or null (plain rmsnorm)
  const int32_t* perm = nullptr; // [K] or null
  const int8_t* signs = nullptr; // [K] or null
  float* dst = nullptr;          // [rows, K]
  int8_t* xq = nullptr;          // [rows, levels, K] int8 digit planes, positions transposed within each 16 (ternary.cu)
  float2* xds = nullptr;         // [rows, K/64] {unit of the 128-group, digit sum of the chunk's 64 elements}
  int64_t ld = 0, rows = 0, K = 0, n = 1;
  int32_t pre = kPreNone, inverse = 0, seg = 0;
  int32_t levels = 2;            // int8 digits per element: 2 (q16) or 1 (q8)
  float eps = 0.f;
  bool warp = true;              // rows >= kSiteWarpMinRows: one warp per 1024 chunk where supported (ternary.cu)
  int32_t cluster = 0;           // AddNorm: the row's K / 1024 tile blocks as one thread-block cluster sharing the
                                 // sum of squares through distributed shared memory (site_cluster_supported); 2: the
                                 // residual stored after the exchange, the second arrive relaxed
  int32_t xpose = 0;             // 1024 tiles: 1 = FWHT strides 32..n/2 as shuffles after one transpose in shared
                                 // memory (2 barriers instead of one per stride); 2 = also no barrier where each
                                 // thread reads its own element, quantised straight from the transpose; bit-identical
  bool row_units = false;        // round 19: quantise every 128-group of a row with the ROW's unit where the site
                                 // can (site_row_units); xds keeps its per-chunk form, each chunk holding that unit
  int32_t nparts = 1;            // round 30: src holds nparts partial sums [nparts][part_stride] of the row, summed in
  int64_t part_stride = 0;       // part order (ffn_fused's chunk partials); > 1 only where site_row_norm_supported
  bool rows_pipe = false;        // round 28: the row-unit site on site_warp_rows_kernel (several rows a block, the next
                                 // row's loads in flight) where site_rows_pipe_supported; bit-identical (the backend's
                                 // Options::site_rows_pipe, on by default)
};
Launch site_launch(const SiteDesc& d);
int site_launch_pre(const Launch& l);  // SiteArgs::pre of a site_kernel launch, else -1 (Options::skip's diagnostic)
// The warp-per-chunk site for prefill rows (site_warp_kernel): rows >= this, K % 1024 == 0, n <= 1024, no
// AddNorm pre-op, no gather with a pre-op, a power-of-two gated-norm segment in [32, 1024], 16-byte aligned rows.
constexpr int64_t kSiteWarpMinRows = 64;  // batched decode (<= 32 rows) keeps site_kernel: the warp grid is too small there (round 3)
bool site_warp_supported(const SiteDesc& d);
// Whether site_launch(d) quantises with one unit per row (d.row_units asked, the warp site without its AddNorm or
// cluster forms, K / 1024 <= 20): then GEMM v3 may scale per token (gemm3_launch's row_units).
bool site_row_units(const SiteDesc& d);
// Whether site_launch(d) takes site_warp_rows_kernel (d.rows_pipe, the row-unit site, no gather, its tiles within one
// block's shared memory: K <= 18 x 1024 with a pre-op's second source, 27 x 1024 without).
bool site_rows_pipe_supported(const SiteDesc& d);
// The cluster form of the AddNorm site (site_kernel_cluster, round 9): K a multiple of 1024 with at most
// kSiteMaxCluster tiles (one cluster per row, portable cluster size), n <= 1024, no gather, gain set, 16-byte
// aligned src / resid rows. Its sum of squares is norm_kernel's, in norm_kernel's order: bit-identical norms.
constexpr int64_t kSiteMaxCluster = 8;
bool site_cluster_shape_ok(int64_t K, int64_t n);
bool site_cluster_supported(const SiteDesc& d);
// The decode-row site (site_row.cu, round 11): a 128-thread block per 1024-element block of a row (8 elements a
// thread, strides 256 / 512 in one shared-memory exchange) instead of site_kernel's 1024-thread tile. Bit-identical to
// site_kernel for the elementwise pre-ops. Supported: rows < kSiteWarpMinRows, no inverse / gather / AddNorm, K % 1024
// == 0, n <= 1024, gated-norm segments of 8..256 dividing 256, 16-byte aligned rows, an int8 output.
bool site_row_supported(const SiteDesc& d);
Launch site_row_launch(const SiteDesc& d);
// Rounds 26-27 (Options::site_row_norm): the add + rmsnorm site of decode rows on the same 128-thread blocks, the row's
// K / 1024 blocks one thread-block cluster that sums the squares through distributed shared memory (the blocks'
// sums in rank order: one rr in every block; not norm_kernel's order, so the normed row differs from the cluster site's
// in the last bits). Small blocks can be resident beside the v7 product before them (site_kernel_cluster's 1024 threads
// cannot), and the gain and signs are loaded before the wait (round 27). Supported: rows < kSiteWarpMinRows, kPreAddNorm
// with a 16-byte aligned gain, K % 1024 == 0 with at most kSiteMaxCluster tiles, n <= 1024, no inverse / gather, pre_out
// not aliasing src / resid, 16-byte aligned rows, an int8 output. At more than one row the launch has no programmatic
// edge into it (Launch::serial_in; round 27: launched early there, it failed at 5-32 rows).
bool site_row_norm_supported(const SiteDesc& d);
// early_rows: the most rows launched with a programmatic edge into the site (more: a full dependency; round 27).
Launch site_row_norm_launch(const SiteDesc& d, int early_rows = 1);
// Largest Hadamard block the site kernel supports.
constexpr int64_t kMaxHadamardBlock = 8192;

// ---- ternary linear ------------------------------------------------------------------------------
// y_i [M, N_i] = x W_i^T for up to kMaxOuts outputs sharing K. Weights canonical: words u32 [N, K/16],
// scales fp16 [N, K/128]. x comes quantised (site_launch): xq int8 [M, levels, K], xds float2 [M, K/64];
// `levels` (1: q8, 2: q16) must be the site's.
constexpr int kMaxOuts = 4;
constexpr size_t kScaleTail = 16;  // bytes a matrix's upload allocates (zeroed) after its scales
struct TernaryDev {
  const uint32_t* words;
  const uint16_t* scales;  // fp16 [N, K/128], followed by kScaleTail readable bytes (GEMM v3 copies 4-byte pairs)
  float* y;
  int64_t N;
};
// dp4a matvec: best for M <= 4 (weights stream once per 4 tokens). rows: weight rows per warp step
// (2: 6-deep pipeline; 4: 3-deep, activation loads shared by 4 rows).
// site (M = 1, levels = 1 only): the activation site that produces xq, computed by every block as its
// prologue (warp_site.cuh, one digit) instead of by a site kernel: reads site->src (src2, gain, signs),
// writes neither site->dst nor site->pre_out nor the global xq. Supported when matvec_site_supported();
// ignored under q16 (the backend never defers a site then).
// balanced: one block per resident slot (2 per SM), the row groups split evenly over the blocks (else fixed
// row groups per warp: some SMs get twice the rows of others; BONSAI_CUDA_MATVEC_BALANCE=0).
Launch matvec_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                     int levels, int sms, int rows = 2, const SiteDesc* site = nullptr, bool balanced = true);
// Makes the M = 1 matvec launch l prefetch the weights of `next` (n_next outputs of width K: the matvec that
// follows it in a decode step) into L2 once each warp is done with its own rows. False (l unchanged) when
// l is not an M = 1 matvec or the weights exceed max_bytes (more than L2 holds next to the running work).
bool matvec_set_prefetch(Launch& l, const TernaryDev* next, int n_next, int64_t K, uint64_t max_bytes);
bool matvec_site_supported(int64_t K, int64_t n, int32_t pre, int64_t seg);
// Bulk-copy matvec (matvec_bulk.cu): q8 only (levels = 1; the backend uses v3 under q16), M = 1, tiles of rows streamed by one producer thread per block with
// cp.async.bulk into a 4-stage shared-memory ring. Supported when K % 1024 == 0; rows: at most 1, 2, 4
// or 8 rows per consumer warp, anything else = chosen per matrix for balance over the SMs; early: tiles
// streamed before the kernel waits on its predecessor (0..4).
bool matvec_bulk_supported(int64_t K, int64_t M);
void init_matvec_bulk_attributes();  // called by init_kernel_attributes
void init_gemm_attributes();         // called by init_kernel_attributes
Launch matvec_bulk_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int sms,
                          int rows = 0, int early = 1);
// Matvec v6 (matvec_mma.cu): int8 tensor cores (mma.sync m16n8k16 u8.s8) on the canonical words, 16- or 32-row
// tiles, one block per SM; the warps of a block walk each tile together (lockstep, the default) or split the
// block's (tile, step) pairs into contiguous ranges. M <= 2 (q16) / 4 (q8); cfg: block shape
// (CudaBackend::Options::matvec6_cfg). cfg 8-10: v7 (round 10), the same step fed by a bulk-copy ring in shared memory
// (8: stage rows by shape, 9: 16, 10: 32; one producer warp, ~200 KB of dynamic shared memory per block), its step on
// m16n8k32 since round 15; cfg 11-13: 8-10 on round 14's m16n8k16 step (bit-identical results); 14: cfg 8, k16 on
// 16-row stages over K > 8,192 (ffn_down).
bool matvec6_supported(int64_t M, int levels, int64_t K);
// split > 1 (split-K, round 9c): one output, its K cut into `split` (<= kMaxOuts) slices of K / split (a multiple
// of 128), each slice's partial y written to part + z M N (float [split, M, N]); the last block to finish a row tile
// (counters: int32 [ceil(N / 16)], zero before the first launch and left zero by every launch) sums the slices in
// slice order into outs[0].y (deterministic). Lockstep shapes only (cfg 0, 5-7). interleave: tiles in row tile major
// order (a block reads contiguous stretches of the same rows, as unsplit), else slice major.
Launch matvec6_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                      int levels, int sms, int cfg = 0, int split = 1, float* part = nullptr, int32_t* counters = nullptr,
                      bool interleave = true, int v7_first = -1, int v7_early = -1);
// v7_early (round 37; CudaBackend::Options::matvec7_early): stages a plain v7 block streams before its wait for the
// kernel before it (-1: the whole ring, as before).
// v7_first (round 15; CudaBackend::Options::matvec7_first): rows of a v7 block's first stage, -1 = its ragged remainder
// (units mod the stage's units; none: a whole stage), 0 = a whole stage (the remainder last), N = N rows.
// Round 24, diagnostic: v7's per-block timeline, in builds with -DBONSAI_V7_TRACE in CMAKE_CUDA_FLAGS (else
// matvec7_trace_compiled() is false and no launch takes a trace). Each block b writes %globaltimer (ns) into
// trace[b * kV7TraceSlots + slot] at its events (the stage slots for its first kV7TrMaxStages stages), and its stage
// count into kV7TrStages.
constexpr int kV7TraceSlots = 32, kV7TrMaxStages = 8;
enum V7TraceSlot : int {
  kV7TrStart = 0,           // thread 0 enters (before the barriers' init)
  kV7TrIssued = 1,          // the producer has issued its first stage's copies
  kV7TrConsumerWaited = 2,  // thread 0 is past griddepcontrol.wait (the activations may be read)
  kV7TrStaged = 3,          // thread 0 is past the activations' staging (the consumer loop starts)
  kV7TrProducerWaited = 4,  // the producer is past griddepcontrol.wait (before its first sum)
  kV7TrDone = 5,            // the producer has written its last y
  kV7TrStages = 6,          // (a count, not a time) the block's stages
  kV7TrFull0 = 8,           // 8..15: thread 0 has stage j's bytes (past full[j])
  kV7TrEmpty0 = 16,         // 16..23: the producer sees stage j consumed by every warp (past empty[j])
};
bool matvec7_trace_compiled();
// False (l unchanged) when l is not a matvec v7 launch or the trace is not compiled in.
bool matvec7_set_trace(Launch& l, uint64_t* trace);
// Round 37, diagnostic: the decode chain's small kernels' timeline in the same builds and buffer (block_trace.cuh's
// CHAIN_TRACE): thread 0 of each block writes %globaltimer (ns) at trace[3 * flat block + event].
enum ChainTraceEvent : int {
  kChainStart = 0,  // thread 0 enters
  kChainWait = 1,   // thread 0 is past griddepcontrol.wait (its input is complete)
  kChainDone = 2,   // thread 0 is done (after the block's last barrier)
};
enum class ChainKernel : int {  // what a *_chain_trace function found (0: not a traced chain kernel)
  kNone = 0,
  kAddNormSite = 1,       // site_row_norm_kernel, one delta
  kAddNormSiteParts = 2,  // site_row_norm_kernel over chunk partials (after the fused FFN)
  kRowSite = 3,           // site_row_kernel (SiLU / sigmoid / gated-norm pre-ops)
  kConvDense = 4,         // conv_dense_kernel: the GDN conv and the a / b pair
  kDeltaStep = 5,         // delta_step_kernel (with its site, its conv or its out projection where fused)
};
// Each points l at trace (capacity: u64 entries) when it is one of its file's traced kernels, 3 x its blocks <= capacity
// and the trace is compiled in; else kNone and l unchanged.
// The backend asks each kernel file in turn.
ChainKernel site_row_chain_trace(Launch& l, uint64_t* trace, int64_t capacity);    // site_row.cu
ChainKernel conv_dense_chain_trace(Launch& l, uint64_t* trace, int64_t capacity);  // elementwise.cu
ChainKernel delta_chain_trace(Launch& l, uint64_t* trace, int64_t capacity);       // delta_rule.cu
// Matvec v7 with the one-row activation site as its prologue (round 11; warp_site.cuh): every block's consumer warps
// compute the site of d (pre-op, signs, FWHT, int8 digits) into shared memory while the producer's weight copies are in
// flight; no site kernel, no fp32 site written. AddNorm writes h += delta (each block a slice, once all blocks have read
// h: counters int32 [2], zero, left zero) and block 0 the normed row (d.pre_out). Supported: one row, no inverse / gather,
// K % 1024 == 0, n <= 1024, gated-norm segments of 8..256 dividing 256, pre_out not aliasing an input. False (out
// unchanged) where it does not apply, v7's two stages included; cfg as matvec6_launch's (0 and 8-10 give v7).
bool matvec7_site_supported(const SiteDesc& d);
// early: the weight stages copied before the prologue is done (-1: the whole ring; the rest wait for it).
bool matvec7_site_launch(const TernaryDev* outs, int n_outs, int64_t K, const SiteDesc& d, int sms, int cfg,
                         int32_t* counters, Launch& out, int early = -1, bool timing_only = false);
// The K slices the backend gives matvec6_launch (1: none): req 0 = none, 1 = automatic (one token; the fewest serial
// steps per warp over S = 1..4), 2..4 = that S where K % (128 S) == 0; only for ffn_down's shape (one output, K >
// 8,192, M <= 2) unless `any` (every single-output product v6 serves).
int matvec6_split_for(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int cfg, int req,
                      bool any = false);
// Batched-decode product (matvec_mma_batch.cu, round 9): mma.sync m16n8k32 u8.s8 on the canonical words, a column per
// activation plane (q16: 4 tokens x 2 digits per n-tile, q8: 8 tokens), 16-row blocks; each warp owns a tile of
// rb_cfg row blocks (0: chosen per shape, 1 or 2) for its K slice with the outputs in registers, one block per SM.
// Any M <= 32; the backend uses it where it measured faster than the GEMM (CudaBackend::Options::matvec_batch).
// prefetch: the weights into L2 ahead of the loads: 0 none, 1 a sector per row per group, 2 chunks of 256 B per row.
bool matvec_batch_supported(int64_t M, int levels, int64_t K);
Launch matvec_batch_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                           int levels, int sms, int rb_cfg = 0, int prefetch = 1);
// Batched-decode product on wgmma (matvec_wgmma_batch.cu, round 10; sm_90a): blocks of 4 warpgroups x 64 rows, one
// per SM, the units (256-row block, 128-group) cut into one balanced range per block; a row block cut between blocks
// is summed in block order by the last to reach it: part = float [matvec_wgmma_part_floats(sms)], counters = int32
// [matvec_wgmma_row_blocks(outs)], zero before the first launch and left zero by every launch. M <= 32.
bool matvec_wgmma_supported(int64_t M, int levels, int64_t K);
void init_matvec_wgmma_attributes();
int64_t matvec_wgmma_row_blocks(const TernaryDev* outs, int n_outs);
int64_t matvec_wgmma_part_floats(int sms);
Launch matvec_wgmma_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds,
                           int64_t M, int levels, int sms, float* part, int32_t* counters);
// Exact-activation product (Options::exact, BONSAI_CUDA_EXACT=1): fp32 x [M, K] as it is, no int8
// quantisation; one warp per weight row, 4 tokens per pass, fp32 accumulation. For parity checks, not speed.
Launch exact_linear_launch(const TernaryDev* outs, int n_outs, int64_t K, const float* x, int64_t M);
// Tensor-core GEMM (int8 mma.sync m16n8k32): tiles of 128 weight rows x 64 tokens (2 cp.async stages), or
// x 32 tokens with 4 stages when M <= 32 (batched decode).
// 4 warps (64 rows) per block instead of 8 when the 8-warp grid would leave SMs idle.
// Split-K (ks > 1, grid.z = ks): slice z of the 128-groups writes its partial product to outs[i].y +
// z * part_stride; splitk_sum_launch then adds the slices in order (deterministic, no atomics).
Launch gemm_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                   int levels, int sms, int ks = 1, int64_t part_stride = 0);
// GEMM v2 (gemm_wgmma.cu, BONSAI_CUDA_GEMM=2): Hopper wgmma m64nNk32 s8 from shared memory; blocks of
// wgs warpgroups (64 weight rows each) x 32 / 64 / 128 tokens (M <= 32 / <= 64 / above; wgs = 1: at most 64),
// the group's weights decoded once per block into shared memory. Same outputs, pairing and split-K contract
// as gemm_launch (grid.z = ks slices, partials at y + z * part_stride). sm_90 only (gemm2_supported).
// swizzle: operand tiles in the 128-byte swizzled layout (else the no-swizzle core-matrix layout, ~6x slower).
bool gemm2_supported(int cc_major, int cc_minor);
void init_gemm2_attributes();  // called by init_kernel_attributes
int gemm2_ksplit(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int wgs);
Launch gemm2_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                    int levels, int wgs, int ks = 1, int64_t part_stride = 0, bool swizzle = true);
// GEMM v3 (gemm_ws.cu, BONSAI_CUDA_GEMM=3): warp-specialised wgmma: a producer warpgroup streams the raw
// words and swizzled activation tiles into an mbarrier ring, two consumer warpgroups (64 rows each, weights
// decoded into wgmma's register A operand) take turns on the tensor pipe. Blocks of 128 rows x 32 / 64 / 128
// tokens (M <= 32 / <= 64 / above), one per SM (occ 2, M <= 32: two, round 17). Same outputs, pairing and split-K
// contract as gemm2_launch.
// sm_90 only (gemm2_supported). cvt: the per-group int -> float as I2FP (1) or the mantissa add (0): bit-identical.
// row_units (round 19): xds holds one unit per token (site_row_units): d_w per group, the unit once per output.
void init_gemm3_attributes();  // called by init_kernel_attributes
int gemm3_ksplit(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int levels, int sms, int occ = 1);
Launch gemm3_launch(const TernaryDev* outs, int n_outs, int64_t K, const int8_t* xq, const float2* xds, int64_t M,
                    int levels, int ks = 1, int64_t part_stride = 0, int cvt = 1, int occ = 1, bool row_units = false);
// GEMM v4 (gemm_f16.cu, Options::gemm_f16, round 13): the product on the fp16 tensor cores with each group's scale
// folded into the weights (A = (code - 1) d_w, exact in fp16) and the activation in fp16 (xh, written from the site's
// digits by xh_pack_launch): fp32 accumulation over all of K, no per-group scaling. Same outputs, pairing and split-K
// contract as gemm3_launch; its plan and launch are in gemm3_fold.h (its split is v3's folded one). sm_90 only
// (gemm2_supported). The activation's precision is fp16's (README, Parity).
void init_gemmh_attributes();  // called by init_kernel_attributes
int64_t gemmh_xh_bytes(int64_t M, int64_t K);  // bytes of xh for M tokens
// xh [ceil(M / 8)][K / 64][1024 B] = the q16 / q8 activation (xq, xds) in fp16 as the GEMM's swizzled B tiles.
Launch xh_pack_launch(const int8_t* xq, const float2* xds, int64_t M, int64_t K, int levels, void* xh);
// K slices for the GEMM of these outputs: > 1 when the grid would leave SMs idle over a long K. waves:
// also when the grid just overflows the resident block slots (a second, nearly empty round of blocks).
int gemm_ksplit(const TernaryDev* outs, int n_outs, int64_t K, int64_t M, int sms, bool waves = true);
// y [n] = sum over k < ks of part[k * stride + j], in k order.
Launch splitk_sum_launch(const float* part, int64_t stride, int ks, int64_t n, float* y);

// ---- norms ---------------------------------------------------------------------------------------
// norm_kernel's block size for a row of n (its sum-of-squares order; the cluster site replays it).
constexpr int64_t norm_block_threads(int64_t n) { return n >= 2048 ? 1024 : 256; }
Launch rmsnorm_launch(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out);
Launch add_rmsnorm_launch(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                          float* out);
Launch l2norm_launch(float* x, int64_t rows, int64_t hd, float eps);
Launch gated_rmsnorm_launch(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                            float* out);

// ---- elementwise / copies --------------------------------------------------------------------------
Launch rope_launch(float* x, int64_t M, int64_t H, int64_t D, int64_t rot, int64_t p0, float theta);
Launch scale_launch(float* x, int64_t n, float s);
Launch sigmoid_mul_launch(float* x, const float* gate, int64_t n);
Launch silu_mul_launch(const float* gate, const float* up, int64_t n, float* out);
// Round 30: out [n] = sum over p of parts [p][n] in part order (ffn_fused's chunk partials where no site sums them).
Launch parts_sum_launch(const float* parts, int64_t n_parts, int64_t n, float* out);
Launch copy_rows_launch(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols);
Launch permute_launch(const float* x, int64_t rows, int64_t K, const int32_t* perm, float* out);
Launch zero_launch(float* x, int64_t n);
// Embedding gather + de-quantisation: out [M, K]; ids inline (M <= kInlineIds) or from ids_dev.
constexpr int kInlineIds = 64;
Launch embed_launch(const uint32_t* words, const uint16_t* scales, int64_t K, const int32_t* host_ids,
                    const int32_t* ids_dev, int64_t M, float* out);
// Dense y_i [M, N_i] = x w_i^T for one or two weight matrices sharing x [M, K]; w fp32 or bf16 bits.
struct DenseDev {
  const void* w;
  float* y;
  int64_t N;
};
Launch dense_launch(const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* x, int64_t M);
// Round 29 (dense_mma.cu): the prefill form on the tensor cores, bf16 weights, x split in three bf16 pieces; dense_launch
// takes it where supported (M > 32, K % 32 == 0, at most 128 rows together; BONSAI_CUDA_DENSE_MMA=0 turns it off).
bool dense_mma_supported(const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* x, int64_t M);
Launch dense_mma_launch(const DenseDev* outs, int n_outs, int64_t K, const float* x, int64_t M);

// ---- batched decode: several sequences, one token each (Backend::*_rows) ----------------------------
// Per-row positions and per-sequence memory travel INLINE in the launch arguments, so a cached decode
// graph replays a batched step by patching arguments only; at most kMaxBatchRows rows per launch (the
// backend falls back to one launch per row above that).
constexpr int64_t kMaxBatchRows = 64;
struct RowTable {
  int64_t pos[kMaxBatchRows];  // position of row m's token in its own sequence
  float* a[kMaxBatchRows];     // row m's K cache / conv state / recurrent state
  float* b[kMaxBatchRows];     // row m's V cache (attention, KV write)
};
// NEOX RoPE in place on x [M, H, D], row m at position t.pos[m].
Launch rope_rows_launch(float* x, int64_t M, int64_t H, int64_t D, int64_t rot, const RowTable& t, float theta);
// Row t.pos[m] of K cache t.a[m] (V cache t.b[m]) [capacity, row] = row m of k (v) [M, row].
Launch kv_write_rows_launch(const RowTable& t, const float* k, const float* v, int64_t M, int64_t row);
// GDN conv for one token per row: x, out [M, C]; conv state of row m = t.a[m] [Kc-1, C].
Launch gdn_conv_rows_launch(const float* x, const RowTable& t, const float* taps, int64_t M, int64_t C, int64_t Kc,
                            float* out);
// Round 22: the conv rows above and the dense pair of dense_launch (M <= 32 rows of dx: its row-per-block form) in one
// launch.
Launch gdn_conv_dense_rows_launch(const float* x, const RowTable& t, const float* taps, int64_t M, int64_t C, int64_t Kc,
                                  float* out, const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* dx);

// ---- attention -------------------------------------------------------------------------------------
// Causal GQA attention, flash-decoding style: grid (splits, Hkv, M); each block does one split of the
// positions for one query row and one KV head (all Hq/Hkv query heads of it); the last block of a
// (row, kv head) to finish merges the splits. Scratch: part_o [M, Hq, splits, D], part_ml
// [M, Hq, splits, 2], counters int32 [M, Hkv] (zero; left zero).
struct AttnDesc {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  float* part_o;
  float* part_ml;
  int32_t* counters;
  int64_t M, p0, Hq, Hkv, D;
  int32_t splits;
  float scale;
  int32_t pairs = 1;               // decode (M = 1 or rows): positions per warp step, 1 or 2 (Options::attn_pairs)
  int32_t hsplit = 1;              // decode (M = 1, no rows): the G query heads of a KV head spread over this many
                                   // blocks (a divisor of G): grid (splits, Hkv * hsplit); short contexts (few splits)
                                   // otherwise run on Hkv blocks, each walking G heads per position serially
  const RowTable* rows = nullptr;  // set: row m of q attends over its own caches rows->a[m], rows->b[m] up to
                                   // position rows->pos[m] (k, v, p0 unused)
};
Launch attention_launch(const AttnDesc& d);
// AttnDesc::hsplit for one decode row: the largest divisor of G (query heads per KV head) that keeps splits x Hkv x
// hsplit blocks within one wave of `sms`. Short contexts (one split per 64 positions) otherwise run on Hkv = 4 blocks
// that walk G = 6 heads per position serially (17 us per layer at depth 0 on the H200); a long context fills the SMs
// with splits already, and more blocks per KV head would re-read its K / V rows from DRAM.
int attention_head_split(int64_t splits, int64_t Hkv, int64_t G, int sms);
// Options::attn_long (round 14): from kAttnLongSplits splits on, the smallest divisor h >= hsplit of G with at most two
// query heads per block (G / h <= 2: the 2-head kernel instance, 128 registers instead of 244); hsplit otherwise.
constexpr int64_t kAttnLongSplits = 16;
int attention_long_head_split(int64_t splits, int64_t G, int hsplit);
// Prefill (one sequence, M query rows at positions p0..p0+M-1; rows must be null, splits ignored): 32-row x
// 32-position tiles in shared memory, grid (ceil(M / 32), Hq) (mixers.cu, round 8b); version 1: 2 rows per thread
// (256 threads), 2: 4 rows per thread (128 threads).
Launch attention_prefill_launch(const AttnDesc& d, int version);
// Round 12 (attn_prefill_mma.cu): the same on the tensor cores, mma.sync f16 -> f32, grid (ceil(M / 8), Hkv), one
// block per KV head and 8 query positions. split: each operand as f16 hi + lo, 3 mmas a product (fp32-level); else
// hi only. Operands must stay within f16 range (|scale q|, |k|, |v| < 65,504).
// Round 18: planes (non-null) = the K / V window [0, p0 + M) as f16 hi / lo planes [Hkv][4][tp][D] that kv_planes_launch
// wrote (tp >= p0 + M positions per plane): the blocks copy them instead of converting every tile (bit-identical).
Launch attention_prefill_mma_launch(const AttnDesc& d, bool split, const void* planes = nullptr, int64_t tp = 0);
int64_t kv_planes_halves(int64_t T, int64_t Hkv, int64_t D);  // halves of the planes for T positions
Launch kv_planes_launch(const AttnDesc& d, void* planes, int64_t tp);  // planes: fp16 [Hkv][4][tp][D]
void init_attention_attributes();  // called by init_kernel_attributes
constexpr int64_t kAttnMaxGroup = 8;    // Hq / Hkv
constexpr int64_t kAttnMaxDim = 256;    // D (multiple of 32)
constexpr int64_t kAttnMaxSplits = 32;  // decode (one query row per sequence); prefill chunks use at most 16

// ---- Gated DeltaNet --------------------------------------------------------------------------------
// Whether a T-token conv takes conv_seq4_kernel (round 29: 4 channels a lane, token slices; elementwise.cu), else
// conv_seq_kernel (T > 1) or conv_kernel. BONSAI_CUDA_CONV4=0 turns it off.
bool conv_seq4_supported(const float* x, const float* state, const float* out, int64_t T, int64_t C, int64_t Kc);
Launch gdn_conv_launch(const float* x, float* state, const float* taps, int64_t T, int64_t C, int64_t Kc, float* out);
// One decode token: the conv above (T = 1) and the dense product of dense_launch (M = 1, x = dx) in one launch.
Launch gdn_conv_dense_launch(const float* x, float* state, const float* taps, int64_t C, int64_t Kc, float* out,
                             const DenseDev* outs, int n_outs, bool bf16, int64_t K, const float* dx);
Launch gdn_gates_launch(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                        float* g, float* beta);
// Token-by-token delta rule with the state of a 32-column slice of one V head in registers: grid
// (Nv, Dv/32). Optional fused prologue (the ops the forward issues just before): l2norm of q and k
// (eps_q/eps_k > 0 marks them), q *= q_scale, gates from (a, b, A, dt_bias). Fused results are also
// written back to q, k, g, beta so every buffer ends as the unfused sequence leaves it.
struct DeltaDesc {
  float* state;
  float* q;
  float* k;
  const float* v;
  float* g;
  float* beta;
  float* out;
  const float* a;        // non-null: compute g, beta here
  const float* b;
  const float* A;
  const float* dt_bias;
  int64_t T, Nk, Nv, Dk, Dv;
  int32_t l2_q, l2_k;
  float eps_q, eps_k, q_scale;
  int32_t pad;
  const RowTable* rows = nullptr;  // set: T rows, row m one token of its own sequence, state rows->a[m]
  // Floats from one token's q / k / v row to the next's: Nk Dk / Nk Dk / Nv Dv when packed, larger when q, k, v
  // are read in place from the conv output [T, C] instead of through three copies (emit_delta).
  int64_t ldq = 0, ldk = 0, ldv = 0;
  int step_warps = 8;  // T = 1 of one sequence: delta_step_kernel with 8 / 4 warps; 0: delta_kernel
  int rows_warps = 0;  // batched rows: delta_rows_kernel with 8 / 16 warps (Dv = 128); 0: delta_kernel
  int rows_split = 1;  // delta_rows_kernel: column slices per state (1, 2, 4; round 22), one block each
  // Round 26 (Options::delta_site): the decode token's gated-norm site of `out` in the same launch, computed by the
  // last of the 32 blocks that write each 1024-element chunk of out (site_count: int32 [Nv Dv / 1024], zero between
  // launches, left zero). Only where delta_site_supported; the site kernel and its hop on the decode chain go.
  const SiteDesc* site = nullptr;
  int32_t* site_count = nullptr;
  // Round 29 (Options::delta_conv): the decode token's conv (+ SiLU) of q / k / v and its dense a / b pair computed in
  // the step's own launch (conv_dense_kernel's work: one launch fewer on the chain per GDN layer), where
  // delta_conv_supported. q / k / v above then point into conv->out, which the fused step does not write (the forward
  // reads those values only here), and the gates' a / b are computed, not read.
  const struct DeltaConvIn* conv = nullptr;
  // Round 31 (Options::delta_out): the out projection of the site's digits in the same launch too (needs site), where
  // delta_out_supported and delta_out_resident.
  const struct DeltaOutDesc* out_proj = nullptr;
};
// The out projection of a fused decode step (DeltaDesc::out_proj): chunk c = [1,024 c, 1,024 c + 1,024) of out's
// columns gives parts[c] = words[:, chunk c] . digits[chunk c], for the kernel after to sum (the AddNorm row site's
// PARTS instance, or parts_sum_launch).
struct DeltaOutDesc {
  const uint32_t* words = nullptr;   // u32 [D, Nv Dv / 16]
  const uint16_t* scales = nullptr;  // fp16 [D, Nv Dv / 128]
  float* parts = nullptr;            // [Nv Dv / 1024, D]
  int32_t* flags = nullptr;          // int32 [2 Nv Dv / 1024]: zero before the first launch, left zero by every launch
  int64_t D = 0;                     // rows of the projection
};
// The conv + a / b inputs of a fused decode step (DeltaDesc::conv).
struct DeltaConvIn {
  const float* x;     // [C] the conv's input (the qkv product's row: q | k | v channels)
  float* state;       // [Kc - 1][C] the conv state, shifted in place (as gdn_conv does)
  const float* taps;  // [C][Kc]
  const float* out;   // [C] the conv output the separate launch would write (DeltaDesc::q / k / v point into it)
  const void* wa;     // [Nv][E] the a projection (bf16 when bf16, else fp32)
  const void* wb;     // [Nv][E] the b projection
  const float* dx;    // [E] the normed row they read
  int32_t* count;     // int32 [Nk] blocks past their q / k conv, per K head (zero between launches, left zero)
  int64_t C, Kc, E;
  bool bf16;
};
Launch delta_launch(const DeltaDesc& d);
// Whether delta_launch(d) with d.conv = &c fuses: one decode token of one sequence on delta_step_kernel at 8 warps
// (dense_kernel's thread layout: the same a / b sums bit for bit), the gates folded (d.a, d.b, A, dt_bias), q / k / v
// inside c.out, 2 Dk <= 256 (a q / k channel a thread), 1 <= Kc <= 8, E % 8 == 0 with 16-byte aligned dx and weights.
bool delta_conv_supported(const DeltaDesc& d, const DeltaConvIn& c);
// Whether delta_launch(d) with d.site = &s fuses: one token of one sequence on delta_step_kernel (step_warps 4 / 8),
// s the gated-norm site of d.out as site_row_kernel runs it (site_row_supported, one row, K = Nv Dv), 16-byte
// aligned out. The outputs are site_row_kernel's bit for bit (same values, same operations in the same order).
bool delta_site_supported(const DeltaDesc& d, const SiteDesc& s);
// Whether delta_launch(d) with d.site and d.out_proj set fuses the projection (its shape and pointers): the site fused
// (delta_site_supported) on 8 warps, the conv (if any) fused, q8 / q16 digits, D % 512 == 0 and D <= 8,192 (D / 32
// rows a block, whole 16-row blocks), 16-byte aligned words, scales and parts.
bool delta_out_supported(const DeltaDesc& d);
// Whether that launch's whole grid (Nv x Dv / 32 blocks) is resident at once on sms SMs (an occupancy query: false
// without a device). Required: a chunk's blocks wait for the chunk's last one.
bool delta_out_resident(const DeltaDesc& d, int sms);
void init_delta_out_attributes();  // called by init_kernel_attributes

// The attention prologue (attn_prep.cu; Backend::attention_prep): q = rope(rmsnorm(q half of q_gate) * q_gain),
// gate = the gate half, and rope(rmsnorm(k) * k_gain) and v appended to the KV cache(s), one launch.
struct AttnPrepDesc {
  const float* q_gate;  // [M, H, 2 Dh]
  float* q;             // [M, H, Dh]
  float* gate;          // [M, H, Dh]
  const float* k;       // [M, Hkv, Dh]
  const float* v;       // [M, Hkv, Dh]
  const float* q_gain;  // [Dh] (device)
  const float* k_gain;  // [Dh] (device)
  float* k_cache;       // one sequence: [capacity, Hkv, Dh], rows p0 .. p0 + M - 1 written
  float* v_cache;
  int64_t M, H, Hkv, Dh, rot, p0;
  float eps, theta;
  const RowTable* rows = nullptr;  // batched: row m at rows->pos[m] of K cache rows->a[m] / V cache rows->b[m]
};
constexpr int64_t kAttnPrepMaxDh = 512;
bool attn_prep_supported(int64_t Dh, int64_t rot);
Launch attn_prep_launch(const AttnPrepDesc& d);
constexpr int64_t kDeltaMaxDk = 128;
// Chunked (WY / UT-transform) delta rule for one sequence (delta_chunk.cu; d.rows must be null), the same
// function as delta_launch: per chunk of kDeltaChunk tokens, kernel 1 (all chunks in parallel, grid (Nv, chunks))
// builds W, U, the decayed Q and K and the masked decayed Q K^T into `scratch`; kernel 2 (grid (Nv, Dv/32)) runs
// the chunks in order on the state slice. Dk <= 128, Dv <= 128 and a multiple of 32.
constexpr int64_t kDeltaChunk = 64;
size_t delta_chunk_scratch_floats(int64_t T, int64_t Nv, int64_t Dk, int64_t Dv);
// mma (round 12): the products on tensor cores (3xTF32) and the solve per column (Dk 64 or 128; other Dk run the
// round-8b FFMA kernels).
void delta_chunk_launches(const DeltaDesc& d, float* scratch, bool mma, Launch out[2]);
void init_delta_chunk_attributes();  // called by init_attention_attributes

// ---- utilities -------------------------------------------------------------------------------------
// Per-row argmax of x [rows, n] (n <= INT32_MAX) into out int32 [rows] (device): `chunks` blocks per row (argmax_rows_chunks); with
// chunks > 1, part_v float [rows, chunks], part_i int64 [rows, chunks] and counters int32 [rows] (zero before the first
// launch, left zero by every launch).
constexpr int kArgmaxRowThreads = 1024;
constexpr int kArgmaxRowMaxChunks = 64;  // <= kArgmaxRowThreads (the last block merges one partial per thread)
int argmax_rows_chunks(int64_t rows, int64_t n, int sms);
Launch argmax_rows_launch(const float* x, int64_t rows, int64_t n, int32_t* out, int chunks, float* part_v,
                          int64_t* part_i, int32_t* counters);
// Sampling's top-k pick (sampling.cu; Backend::top_k): the penalty on the n_pen listed tokens of x [n] (in
// place), then the k largest (NaN dropped) by value descending, index ascending, into out int32 [1 + 2k] on
// the device: the count of non-NaN values | ids [k] | values [k] (float bits). One block.
constexpr int kMaxTopK = 1024;
constexpr int kMaxTopKPenalized = 256;  // listed inline in the launch record
Launch top_k_launch(float* x, int64_t n, int32_t k, float penalty, const int32_t* penalized, int32_t n_pen,
                    int32_t* out);
// Streaming read of buf [n16 x 16 bytes]; writes one word per block into sink [gridDim].
Launch probe_launch(const void* buf, int64_t n16, uint32_t* sink, int blocks);
// Synchronisation probes (sync_probe.cu, round 15), one block per SM of kSyncProbeThreads threads and `smem` bytes of
// shared memory (up to kSyncProbeSmem): an empty dependent kernel (its hop: griddepcontrol.wait on the previous one;
// block 0 bumps count[0]) and `rounds` grid-wide barriers in one kernel (count: int32, zero before the launch).
constexpr int kSyncProbeThreads = 672;
constexpr uint32_t kSyncProbeSmem = 200 * 1024;
Launch sync_probe_hop_launch(int32_t* count, int blocks, uint32_t smem);
Launch sync_probe_barrier_launch(int32_t* count, int rounds, int blocks, uint32_t smem);
void init_sync_probe_attributes();

// The tensor-core ceiling of GEMM v3's consumer loop (wgmma_probe.cu, round 20): one block per SM, `groups`
// 128-groups per consumer from one resident stage (no producer, no memory traffic). sink: float [blocks][256].
enum WgmmaProbeMode {
  kWgmmaProbeRS = 0,         // the bare wgmma stream, A from registers (8 x m64n128k32 per group)
  kWgmmaProbeSS = 1,         // the same with A from shared memory
  kWgmmaProbeV3 = 2,         // v3's consumer loop: decode4 of raw words, the turn-taking, the per-group scaling
  kWgmmaProbeV3NoTurns = 3,  // v3's loop without the turn-taking
  kWgmmaProbeV3NoScale = 4,  // v3's loop without the scaling
  kWgmmaProbeV3Fence = 5,    // v3's loop with its per-group proxy fence (the full barrier's companion)
  kWgmmaProbeV3Pinned = 6,   // v3's loop with the decoded fragments pinned before the turn (ptxas otherwise sinks the
                             // decode of k-steps 1-3 between the wgmmas and injects warpgroup.arrive: C7519)
  kWgmmaProbeV3Mant = 7,     // v3's loop with the int -> float by the mantissa add (CVT 0)
  kWgmmaProbeV3Split = 8,    // v3's loop with half the conversions each way (CVT 2)
  kWgmmaProbeV3Arrive = 9,   // v3's loop with every consumer thread arriving on a shared-memory mbarrier per group
  kWgmmaProbeV3WarpArrive = 10,  // the same with one arrival per warp
  kWgmmaProbeModes = 11
};
Launch wgmma_probe_launch(int mode, float* sink, int blocks, int groups);
void init_wgmma_probe_attributes();

// ---- round 30: the batch-1 FFN in one launch (ffn_fused.cu) ------------------------------------------------------
// One token: g, u [F] = gate x, up x from x's digits (xq int8 [levels, D], xds [D/64]); then, per 1,024-column chunk
// c of ffn_down's input, the SwiGLU site's digits (silu(g) u, signs, FWHT of block n, int8: bit-identical to
// site_row_launch's) and parts [C = F / 1,024, D] = that chunk's share of ffn_down's product. sum_c parts[c] is ffn_down's
// y up to the fp32 order of the sum (the chunks are summed by the caller in chunk order). One block per SM (grid = sms)
// in C groups that meet at a software barrier: count int32 [2 C], zero before the first launch and left zero by every
// launch. gate / up: [F, D] canonical; down: [D, F]. Supported: D % 1,024 == 0 (<= 5,120), F % 1,024 == 0, C <= sms,
// n a power of two <= 1,024, levels 1 or 2, g / u / parts 16-byte aligned.
struct FfnFusedDesc {
  TernaryDev gate{}, up{}, down{};  // words / scales (y unused)
  const int8_t* xq = nullptr;
  const float2* xds = nullptr;
  float* g = nullptr;               // [F] gate rows
  float* u = nullptr;               // [F] up rows
  const int8_t* signs = nullptr;    // [F] or null
  float* parts = nullptr;           // [F / 1024, D]
  int32_t* count = nullptr;         // [2 F / 1024]
  float* y = nullptr;               // round 37: [D] the partials' sum, in chunk order, by the kernel (its blocks sum each
                                    // 32-row tile once every chunk has stored it); null: parts only (the site sums them)
  int32_t* tile_count = nullptr;    // with y: [ceil(D / 32)] zero before the first launch, left zero
  int64_t D = 0, F = 0, n = 1024;
  int32_t levels = 2;
  int32_t rows_a = 32;              // rows of a gate / up stage: 16 or 32 (v7's gate+up shape)
  int32_t b_copy = 0;               // round 33: ffn_down's stage copies: 0 a bulk copy a row, 1 cp.async by the producer's
                                    // lanes, 2 2-D tensor-map boxes (needs ffn_fused_tensor_maps_available); same bytes
  int32_t phases = 3;               // timing only (the kernel bench): 1 gate / up alone, 2 ffn_down alone, 0 neither (the
                                    // launch, group barrier and site: the fixed cost), 4 / 12 phase 0 less the site /
                                    // the site and the barrier; the output is wrong unless 3
  int32_t balance = 0;              // round 34: gate / up rows over the blocks: 0 the group's chunk over its blocks; 1 all
                                    // chunks' evenly over all blocks; 2 so that every block's gate / up + ffn_down bytes
                                    // are even (a 7-block group's blocks take fewer gate / up rows). Bit-identical.
  bool release = false;             // round 36: the group barrier's arrival as one red.release by the producer's lane 0
                                    // after a warp barrier, not a fence in every lane and a relaxed add. Same values.
                                    // The backend's default since round 37 (Options::ffn_release).
  int32_t early = -1;               // round 37: ring stages streamed before the kernel's wait for its predecessor (-1: the
                                    // whole ring, round 30's form); the same values
  float balance_weight = 1.0f;      // balance 2: an ffn_down row's weight against its bytes (0 = balance 1's even
                                    // gate / up shares; 0-4)
};
bool ffn_fused_tensor_maps_available();  // the driver's tensor-map encoder is reachable (b_copy 2)
// balance 1 / 2's phase-A table, for the host tests: block b's units [lo[b], hi[b]) of the unit sequence whose segment k
// (256 units: chunk perm[k]'s gate then up rows) holds chunk perm[k]; empty for balance 0 or an unsupported shape.
struct FfnBalanceTable {
  std::vector<int> lo, hi, perm;
};
FfnBalanceTable ffn_balance_table(const FfnFusedDesc& d, int sms);
// Block `block`'s phase-A stages in order (the kernel's own plan, for the host tests): gate (0) or up (1) rows
// [row, row + rows) of that output's F rows, and after the stage (arrive_chunk >= 0) arrive_units 8-row units counted in
// on that chunk's barrier. Empty for an unsupported shape.
struct FfnStageA {
  int output = 0, row = 0, rows = 0, arrive_chunk = -1, arrive_units = 0;
};
std::vector<FfnStageA> ffn_phase_a_plan(const FfnFusedDesc& d, int sms, int block);
// Its shared memory's regions (byte offsets from the dynamic shared memory's start) for a shape, as the kernel carves
// them: the ring's `stages` slots, the mbarriers at `full` (2 ST of 8 bytes), the partials at `red` (ST + 1 slots), the
// chunk's digits at `xs` / `xs_d`, the site's exchange at `scratch`, and `end` (the launch's dynamic shared memory).
struct FfnSmemRegions {
  int stages = 0;
  int64_t stage_bytes = 0, full = 0, red = 0, xs = 0, xs_d = 0, scratch = 0, end = 0;
};
FfnSmemRegions ffn_smem_regions(const FfnFusedDesc& d);
// Round 36, diagnostic: the fused FFN's per-block timeline, in the builds and the buffer of v7's (kV7TraceSlots a block,
// matvec7_trace_compiled). Slots 0-6 and the stage slots as v7's: start; the producer's first copy issued; the
// consumers (thread 0) past griddepcontrol.wait; phase A's activations loaded; the producer past its wait; the
// producer's last partials written; the stage count; thread 0 past full[j] (both phases' stages in order) and the
// producer past empty[j]. Then the fused kernel's own events (thread 0):
enum FfnTraceSlot : int {
  kFfnTrLastA = 24,   // phase A's last stage consumed
  kFfnTrPolled = 25,  // the group barrier passed (its poll)
  kFfnTrSite = 26,    // the chunk's digits in shared memory (past the site's block barrier)
  kFfnTrFullB = 27,   // phase B's first stage's bytes seen
};
// False (l unchanged) when l is not a fused-FFN launch or the trace is not compiled in.
bool ffn_fused_set_trace(Launch& l, uint64_t* trace);
bool ffn_fused_supported(const FfnFusedDesc& d, int sms);
bool ffn_fused_shape_ok(const FfnFusedDesc& d, int sms);  // its shape half (D, F, n, levels, rows_a; no pointers)
Launch ffn_fused_launch(const FfnFusedDesc& d, int sms);
void init_ffn_fused_attributes();  // called by init_kernel_attributes

// One-time function attributes (dynamic shared memory limits). Idempotent.
void init_kernel_attributes();

// ---- round 11 (prefill) ----------------------------------------------------------------------------------
// The AddNorm site of prefill rows as one launch (site_norm_warp_kernel, ternary.cu; Options::site_norm_warp): a block
// per row runs norm_kernel's pass, then the warp site's stages per 1024 chunk from shared memory; bit-identical to
// norm_kernel + site_warp_kernel. site_launch takes it for SiteDesc::warp, kPreAddNorm, rows >= kSiteWarpMinRows,
// K % 1024 == 0 up to kSiteNormWarpMaxK (the row in shared memory), n <= 1024, no gather, 16-byte aligned rows.
constexpr int64_t kSiteNormWarpMaxK = 8192;
bool site_norm_warp_supported(const SiteDesc& d);

}  // namespace bonsai::cuda
