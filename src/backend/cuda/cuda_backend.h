// CudaBackend: the Backend interface on one NVIDIA GPU (written for the H200, sm_90a).
//
// Everything lives on the device: the canonical weights (uploaded as they are: ternary words + fp16
// scales; device weight bytes == pack weight bytes), activations, KV caches and recurrent states
// (Buffer memory is cudaMalloc'd). The host only issues work on one stream.
//
// Numerics (stated and tested in tests/cuda): the ternary products quantise the activation per 128-group
// to two balanced int8 digits under one scale (q16: d = max|x|/127, x ~= d (q0 + q1/254), error <= d/508;
// the CPU backend's default form) and accumulate exactly in int32 (254 I0 + I1; dp4a for M <= 2 (q8: 4), int8
// tensor cores above: wgmma on sm_90, mma.sync elsewhere); Options::act_levels = 1 (q8) keeps one digit. Everything else is fp32 (RoPE angles
// in fp64); GDN state fp32.
//
// Speed machinery, all invisible to the forward:
// - Peephole fusion: cheap ops are deferred and fused into the op that consumes them (copy / permute /
//   silu_mul / sigmoid_gate_mul / gated_rmsnorm + hadamard_forward = one "site" kernel that also writes
//   the int8 activation the next linear reads; l2norm q/k + scale + gates + delta rule = one kernel; the
//   two dense a/b projections = one kernel). Fusion only elides writes to dead intermediates: with
//   fusion, the q/k fed to gdn_delta_rule are left un-normalised (the forward never reads them again).
// - Decode steps as CUDA graphs: an M = 1 embed_rows opens a step; every launch until the next sync
//   point (copy_to_host, copy_from_host, allocate, release, argmax, synchronize) is recorded; the step
//   becomes one graph, cached by its shape; later steps patch only the nodes whose arguments changed
//   (positions, token id, KV row); a new shape (the attention split count grows every 64 tokens up to
//   1024) builds a new graph. Kernels chain with programmatic dependent launch (PDL).
// Measured on the H200 (27b preset, q16): tg128 130 tok/s at depth 0, 117 at depth 8192 (round 6); batched greedy
// B = 8 584, B = 32 1,794 tok/s (round 7, the warp-specialised wgmma GEMM); pp512 4,197, pp2048 3,828 tok/s
// (256-token chunks; round 8b: chunked delta rule, tiled prefill attention). docs/cuda-kernels.md has the
// breakdown and every version's numbers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace bonsai {

namespace cuda {
struct Launch;  // launch.h
}

class CudaBackend final : public Backend {
 public:
  // --act f16 / BONSAI_CUDA_ACT=f16: GEMM v4 (Options::gemm_f16) from this many tokens: every product the GEMMs serve
  // (M <= 2 is the matvec's), at M <= 32 only where it is faster (ternary_launches).
  static constexpr int kF16MinRows = 3;
  struct Options {
    int device = 0;
    bool graphs = true;        // decode steps as CUDA graphs
    int graph_segment = 64;    // round 14: launch a step's graph in segments of this many kernels as they are recorded
                               // (the GPU starts on the first layers while the host records the rest; H200 tg128
                               // 218.1 / 216.4 vs 206.3 / 203.6 tok/s as one graph per step, 128: 217.5, 256: 214.5),
                               // 0 = one graph per step; BONSAI_CUDA_GRAPH_SEGMENT
    bool pdl = true;           // programmatic dependent launch between kernels
    bool fuse = true;          // peephole fusion of deferred ops
    int attn_pairs = 2;        // decode attention: key positions per warp step, 2 (two independent reductions in
                               // flight, round 10's default: +1.5-1.7 % tg at depths 4096 / 8192, even at depth 0 on
                               // the H200) or 1 (round 6); docs/cuda-kernels.md rounds 9-10; BONSAI_CUDA_ATTN_PAIRS=1|2
    int attn_long = 1;         // round 14: decode attention (one sequence) from 16 splits on (>= ~1k positions): its query
                               // heads two per block (hsplit = G / 2, the 2-head kernel instance: 128 registers instead
                               // of 244, two blocks per SM; the hsplit blocks of a KV head read its K / V at the same
                               // time, from L2). H200 tg128 at 4k 199.4 / 198.6 vs 189.4 / 189.8 tok/s, at 8k 187.7 /
                               // 186.7 vs 181.8 / 181.3; BONSAI_CUDA_ATTN_LONG=0: off
    int attn_hsplit = 0;       // decode attention (one sequence): 0 = its query heads spread over more blocks while the
                               // splits leave SMs idle (cuda::attention_head_split, mixers.cu), 1 = one block per
                               // KV head and split (round 6); BONSAI_CUDA_ATTN_HSPLIT=0|1
    bool conv_dense = true;    // a decode token's GDN conv and dense a/b pair in one launch (needs fuse;
                               // BONSAI_CUDA_CONV_DENSE=0: two)
    bool attn_prep = true;     // the attention prologue as one launch (attn_prep.cu; needs fuse; BONSAI_CUDA_ATTN_PREP=0:
                               // the 8-op sequence)
    bool tensor_cores = true;  // int8 mma GEMM for M > 2 (q8: 4) (else the dp4a kernel, 4 tokens per pass)
    bool profile = false;      // time every eager launch with events (serialises; for profile_report);
                               // BONSAI_CUDA_PROFILE=1: on, and the report goes to stderr when the backend ends;
                               // =2: the report also lists the last step's launches in order
    int delta = 0;             // delta rule of one sequence: 1 = token by token (delta_kernel), 2 = the chunked WY
                               // form (delta_chunk.cu) for every T, 0 = chunked for T >= 16 (docs/cuda-kernels.md
                               // round 8b); batched rows always token by token; BONSAI_CUDA_DELTA=0|1|2
    int delta_step = 8;        // round 14: one sequence's decode token (T = 1) on delta_step_kernel with this many warps
                               // (8 or 4; one block barrier), 0 = delta_kernel (five); BONSAI_CUDA_DELTA_STEP
    int site_row_norm = 2;     // rounds 26-27: decode rows' add + rmsnorm site on 128-thread blocks (one cluster per row,
                               // site_row_norm_kernel) instead of site_kernel_cluster's 1024-thread blocks, which cannot
                               // be resident beside a v7 block. 2: every decode row count (at more than one row without a
                               // programmatic edge into it), 1: one-row sites only, 0: off; BONSAI_CUDA_SITE_ROW_NORM
    int site_row_norm_early = 1;  // round 28: the most rows whose site_row_norm_kernel launches early (a programmatic edge);
                                  // past it a full dependency (round 27's fault at 5-32 rows); BONSAI_CUDA_SITE_ROW_EARLY
    bool delta_conv = false;   // round 29: a decode token's GDN conv and dense a / b pair computed by the delta step's own
                               // launch (cuda::delta_conv_supported; needs conv_dense and fuse) instead of one launch
                               // before it; bit-identical, but slower (round 33, H100: tg128 196.8 vs 200.3 tok/s);
                               // BONSAI_CUDA_DELTA_CONV=1
    bool ffn_fused = true;     // round 30: a decode token's SwiGLU FFN (gate+up, the SwiGLU site, ffn_down) as ONE launch
                               // (cuda::ffn_fused_launch: groups of blocks per 1,024 chunk of ffn_down's input meeting at
                               // a software barrier), its chunk partials summed by the AddNorm site after it; where v7
                               // is the batch-1 product (matvec 6, cfg 0, matvec7). On since round 33 (with ffn_b_copy
                               // 2; H100: tg128 212.7 vs 199.7 / 200.7 tok/s); BONSAI_CUDA_FFN_FUSED=0: three launches
    bool delta_out = false;    // round 31: a decode token's GDN out projection (gdn_out) in the delta step's launch too,
                               // after its gated-norm site (needs delta_site; cuda::delta_out_supported / _resident),
                               // its chunk partials summed by the AddNorm site after it. Correct but slower (round 33,
                               // H100: tg128 198.1 vs 200.3 tok/s); BONSAI_CUDA_DELTA_OUT=1
    int ffn_rows = 32;         // round 30: its stage rows, gate / up (16 or 32; ffn_down's stages hold 5 x that);
                               // bit-identical either way. BONSAI_CUDA_FFN_ROWS
    int ffn_b_copy = 2;        // round 33: how its ffn_down stages are copied (cuda::FfnFusedDesc::b_copy): 0 a bulk copy
                               // per row's 256 B and 16 B (H100: 67.6 us an FFN), 1 cp.async by the producer's lanes
                               // (34.7), 2 2-D tensor-map boxes (33.7; 1 where the driver's encoder is unreachable);
                               // bit-identical. BONSAI_CUDA_FFN_BCOPY
    int ffn_balance = 0;       // round 34: its gate / up rows over the blocks (cuda::FfnFusedDesc::balance): 0 the
                               // group's chunk over the group's 7 or 8 blocks, 1 evenly over all blocks, 2 so that each
                               // block's gate / up + ffn_down bytes are even; bit-identical. BONSAI_CUDA_FFN_BALANCE
    float ffn_balance_weight = 1.0f;  // balance 2's weight of an ffn_down row against its bytes (a tuning knob for the
                                      // device A/B: 1 = by bytes). BONSAI_CUDA_FFN_BALANCE_W
    bool ffn_reduce = false;   // round 37: the fused FFN sums its chunk partials itself (cuda::FfnFusedDesc::y), so the
                               // AddNorm site after it reads one delta, not F / 1,024 partials; the same bits. Built,
                               // not yet run on a GPU: off. BONSAI_CUDA_FFN_REDUCE=1
    int ffn_early = -1;        // round 37: its stages streamed before its wait for the kernel before it (-1: the whole
                               // ring; cuda::FfnFusedDesc::early). BONSAI_CUDA_FFN_EARLY
    bool ffn_release = true;   // round 36: its barrier's arrival as one red.release (cuda::FfnFusedDesc::release); on
                               // since round 37 (H100: no-weights launch + barrier 5.89 vs 6.18 us, tg128 205.8 / 207.1
                               // vs 204.7 / 204.8 tok/s). BONSAI_CUDA_FFN_RELEASE=0: a fence per lane + relaxed adds
    bool delta_site = true;    // round 26: a decode token's gated-norm site (the gdn_out input) computed by the delta
                               // step's launch, by the last block of each 1024-chunk (delta_site_supported), instead
                               // of a site_row_kernel after it; bit-identical; BONSAI_CUDA_DELTA_SITE=0|1
    int delta_rows = 8;        // round 18: batched decode's delta rule on delta_rows_kernel with this many warps (8 or
                               // 16: one barrier, vector loads, a block per (head, sequence)), 0 = delta_kernel;
                               // BONSAI_CUDA_DELTA_ROWS
    int delta_rows_split = 2;  // round 22: delta_rows_kernel blocks per state, each a slice of 128 / split columns
                               // (1, 2 or 4; bit-identical; H200 B = 32 2,464 / 2,463 vs 2,442 / 2,440 tok/s with 1,
                               // 2,368 with 4); BONSAI_CUDA_DELTA_SPLIT
    bool delta_mma = true;     // round 12: the chunked form's products on tensor cores (3xTF32) and its solve one column
                               // per thread (delta_prep2 / delta_scan2_kernel); BONSAI_CUDA_DELTA_MMA=0: round 8b's FFMA
                               // kernels (docs/cuda-kernels.md round 12)
    int attn = 0;              // prefill attention: 1 = the flash-decoding kernel (one position per warp step), 2 = the
                               // 32 x 32 tile kernel with 2 rows per thread, 3 = with 4 rows per thread (both for every
                               // M > 1), 0 = 4 rows per thread for M >= 16 (round 8b); BONSAI_CUDA_ATTN=0|1|2|3
    int attn_prefill_mma = 1;  // round 12: where the 4-row tile kernel would run (attn 0 at M >= 16, attn 3), the
                               // tensor-core kernel instead (attn_prefill_mma.cu): 1 = f16 hi + lo operands, 3 mmas a
                               // product (fp32-level; the default: pp2048 5,754 vs 5,012 tok/s in one H200 call), 2 = f16
                               // only (1.3 % faster, 6e-4 op error), 0 = off; docs/cuda-kernels.md round 12;
                               // BONSAI_CUDA_ATTN_MMA=0|1|2
    bool attn_planes = true;   // round 18: that kernel reads the chunk's K / V window as f16 hi / lo planes written once
                               // per launch (kv_planes_kernel) instead of every block converting every tile it reads
                               // (bit-identical); BONSAI_CUDA_ATTN_PLANES=0: the per-block conversion
    bool row_units = true;     // round 19: the prefill warp site quantises each row with ONE unit (not one per 128-group)
                               // and GEMM v3 scales each group by d_w alone, each output by its token's unit once
                               // (H200: pp2048 +9 %; gate 726/726, 2.28e-3, KL 6.7e-8 vs 2.07e-3, 4.3e-8 per group);
                               // BONSAI_CUDA_ROW_UNITS=0: one unit per 128-group everywhere. Not under GEMM v4
                               // (Options::gemm_f16: nothing to save there)
    int matvec_rows = 4;       // weight rows per matvec warp step: 4 or 2 (see ternary.cu; BONSAI_CUDA_MATVEC_ROWS)
    int matvec = 6;            // M <= 2 (q16) / 4 (q8) kernel: 6 = tensor-core matvec v6 (matvec_mma.cu, the default
                               // since round 8: faster than v3 on every kernel-table shape but ffn_down at M = 1, which keeps v3 unless
                               // matvec7, the round-10 default, serves it),
                               // 3 = dp4a register ring v3 (ternary.cu), 4 = bulk-copy stream (matvec_bulk.cu, q8, M = 1,
                               // K % 1024 == 0; faster alone, slower inside the model); BONSAI_CUDA_MATVEC=3|4|6
    int matvec6_cfg = 0;       // v6 (matvec = 6) block shape, rows per tile x steps in flight x warps: 1 = 16 x 3 x 24,
                               // 2 = 16 x 4 x 16, 3 = 32 x 2 x 16, 4 = 32 x 3 x 16 (each warp a contiguous K range);
                               // lockstep (the warps share each tile): 5 = 16 x 4, 6 = 32 x 2, 7 = 16 x 3; 0 = 6, or 7
                               // for <= 2,048 rows or K > 8,192 (matvec_mma.cu; BONSAI_CUDA_MV6)
    int matvec6_split = 0;     // v6 split-K (round 9c): the K range cut into S slices, tiles of their own, summed in slice
                               // order by the last block of each row tile (deterministic). Only on ffn_down's shape
                               // (one output, K > 8,192, M <= 2) and the lockstep shapes (matvec6_cfg 0, 5-7).
                               // 0 = off (the default: it measured slower than v3, ffn_down M1 20.9 vs 15.3 us on the
                               // H200, docs/cuda-kernels.md round 9c), 1 = automatic (one token: S by balance over
                               // the SMs), 2..4 = that S (M <= 2, K % (128 S) == 0); BONSAI_CUDA_MV6_SPLIT=0|1|S
    bool matvec6_split_any = false;  // split-K on every single-output v6 product too (tests, experiments;
                                     // BONSAI_CUDA_MV6_SPLIT_ANY=1)
    bool matvec6_split_ilv = true;   // split-K tiles in row tile major order (a block's tiles are contiguous stretches
                                     // of the same rows), else slice major (BONSAI_CUDA_MV6_SPLIT_ILV=0)
    int matvec7_first = -1;    // round 15: rows of a v7 block's first stage: -1 = its ragged remainder (it ended the block
                               // before: tg128 +0.8 % in one H200 call), 0 = a whole stage, N = N rows; BONSAI_CUDA_MV7_FIRST
    int matvec7_early = -1;    // round 37: stages a plain v7 block streams before its wait for the kernel before it (-1:
                               // the whole ring; a diagnostic for the chain's small kernels); BONSAI_CUDA_MV7_EARLY
    bool matvec7 = true;       // round 10: with matvec6_cfg 0, the bulk-copy-ring matvec v7 (matvec_mma.cu, cfg 8) wherever
                               // v6 serves, and for one token over K > 8,192 (ffn_down) instead of v3: the default since
                               // the same-call A/B on the H200 (tg128 185.9 vs 163.3 / 172.0 tok/s for v6 + v3, 8k
                               // context 159.3 vs 141.4 / 145.9; docs/cuda-kernels.md round 10); BONSAI_CUDA_MV7=0: v6 + v3
    int matvec7_k32 = 1;       // round 15: v7's step on m16n8k32 mmas (8 per 16-row block and step instead of 16;
                               // bit-identical): 1 = but ffn_down's 16-row stages (matvec6_cfg 14), 2 = every stage (cfg 8), 0 =
                               // round 14's k16 step (cfg 11); BONSAI_CUDA_MV7_K32=0|1|2
    int site_prologue = 0;     // round 11: a one-row q16 / q8 site computed by the v7 matvec that reads it, as its
                               // prologue (warp_site.cuh; every pre-op, AddNorm's residual included) instead of by a
                               // site kernel before it: 0 off, 1 every pre-op, else a mask of bit (pre + 1) per pre-op
                               // (2 none, 4 silu * up, 8 x * sigmoid(g), 16 gated norm, 32 add + rmsnorm);
                               // BONSAI_CUDA_SITE_PROLOGUE=N
    int site_early = -1;       // with site_prologue: weight stages copied before the prologue is done (-1: the whole
                               // ring); BONSAI_CUDA_SITE_EARLY=N
    bool site_row = true;      // round 11: decode-row sites (silu * up, x * sigmoid(g), gated norm, plain) on 128-thread
                               // blocks per 1024 elements (site_row.cu) instead of site_kernel: tg128 194.3 / 193.9 vs
                               // 189.0 / 188.6 tok/s in one H200 call (docs/cuda-kernels.md round 11); BONSAI_CUDA_SITE_ROW=0
    int matvec_batch = 0;      // batched-decode kernel (matvec_mma_batch.cu, round 9: mma.sync, a column per activation
                               // plane): 0 = where it measured faster than the GEMM v3 (the default: M 3..8 under q16,
                               // 5..8 under q8, products of >= 64 rows per SM: gate+up, qkv+z, head, not the 5,120-row
                               // ones), 1 = never (v3 as before), 2 = every M <= 32 and shape (v6 first at M <= 2 / 4);
                               // BONSAI_CUDA_MVB=0|1|2; BONSAI_CUDA_MVB_RB=1|2 forces its 16-row blocks per warp tile
    int matvec_batch_rb = 0;   // (0: chosen per shape)
    int matvec_wgmma = 1;      // batched-decode wgmma kernel (matvec_wgmma_batch.cu, round 10: 256-row blocks, one
                               // wgmma per k-step over all 2 M digit planes, stream-K over the SMs): 1 = never (v3 /
                               // matvec_batch; the default since round 12: GEMM v3 with its folded split-K beats it on
                               // gate+up M32 too, 57.4 vs 65.4 us, and B = 32 2,192 / 2,200 vs 2,069 / 2,125 tok/s in one
                               // H200 call), 4 = M 9..32 on 200..999 rows per SM (gate+up only; round 10's default: B = 32
                               // 2,069 vs 1,934 then), 0 = M 9..32 on every product (B = 32 1,840 vs 1,980: slower), 2 = every
                               // M <= 32 and shape (v6 first at M <= 2 / 4), 3 = M 9..32 on products of >= 64 rows per
                               // SM; sm_90a only; BONSAI_CUDA_MVW=0|1|2|3|4 (docs/cuda-kernels.md round 10)
    int matvec_batch_pf = 1;   // its L2 prefetch of the weights: 0 none, 1 a sector per row per group (default), 2
                               // 256-byte chunks per row; within noise of each other (round 9; BONSAI_CUDA_MVB_PF)
    int matvec_bulk_rows = 0;  // v4 rows per warp group: 1, 2, 4, or 0 = chosen per matrix for balance
    int matvec_early = 1;      // v4 tiles streamed before waiting on the previous kernel (BONSAI_CUDA_MATVEC_EARLY)
    bool fuse_norm = false;    // rmsnorm / add_rmsnorm before a site fused into it (needs fuse; BONSAI_CUDA_FUSE_NORM=1;
                               // one block per row: measured slower at decode, see docs/cuda-kernels.md)
    int norm_cluster = 2;      // rmsnorm / add_rmsnorm fused into the site that reads them when the row is at most 8
                               // tiles of 1024 and no warp site runs (< 64 rows): the row's tile blocks as one
                               // thread-block cluster (site_kernel_cluster, ternary.cu; round 9); bit-identical to
                               // the unfused norm + site; needs fuse. 2: the residual stored after the cluster
                               // exchange and the last arrive relaxed (no GPU-scope fence on the way), 1: before,
                               // 0: off; BONSAI_CUDA_NORM_CLUSTER=0|1|2
    int site_xpose = 2;        // site_kernel (1024 tiles): 1 = FWHT strides 32..n/2 as warp shuffles after one transpose
                               // through shared memory (2 barriers instead of 5 at n = 1024); 2 = also no barrier
                               // before the transform for elementwise pre-ops and the int8 quantised straight from
                               // the transpose (4 barriers per tile instead of 8 at 0); 0 = the shared-memory stages;
                               // all bit-identical (round 9); BONSAI_CUDA_SITE_XPOSE=0|1|2
    bool site_warp = true;     // prefill sites (>= 64 rows) one warp per 1024 chunk, no barriers (site_warp_kernel,
                               // ternary.cu; BONSAI_CUDA_SITE_WARP=0: the block-per-chunk site_kernel everywhere)
    bool fuse_site = false;    // a one-row site computed by the matvec that consumes it (its prologue) instead of
                               // by a site kernel (needs fuse; BONSAI_CUDA_FUSE_SITE=1): 676 instead of 933 kernels
                               // per 27b decode step but slower (124 vs 150 tok/s, docs/cuda-kernels.md)
    bool exact = false;        // ternary products on the fp32 activation, no int8 step (BONSAI_CUDA_EXACT=1); slow
    std::string skip;          // DIAGNOSTIC ONLY, wrong results: kernels whose short name (as the profile prints it) starts
                               // with one of these comma-separated prefixes are not launched, so a graph-mode timing
                               // without them measures what they cost on the decode chain (leave-one-out; PDL overlap
                               // makes eager per-kernel times overstate it). BONSAI_CUDA_SKIP=site_kernel,delta_kernel
    bool gemm_wave_split = true;  // split K also when the GEMM grid just overflows the resident block slots
                                  // (BONSAI_CUDA_WAVE_SPLIT=0: only when it leaves SMs idle; round 4)
    int gemm = 0;              // tensor-core GEMM for M > 2: 3 = warp-specialised wgmma v3 (gemm_ws.cu), 2 = wgmma
                               // v2 (gemm_wgmma.cu), 1 = mma.sync (ternary.cu, rounds 2-4); 0 = v3 on sm_90, v1
                               // elsewhere (v2 / v3 need sm_90a: 1 is used in their place); docs/cuda-kernels.md
                               // rounds 5 and 7; BONSAI_CUDA_GEMM=0|1|2|3
    int gemm2_wgs = 2;         // v2 warpgroups per block: 1 (64 rows, 3-4 blocks per SM) or 2 (128 rows, 1-2 per SM,
                               // 128-token tiles for M > 64); BONSAI_CUDA_GEMM2_WGS
    int prefill_chunk = 2048;  // tokens per prefill chunk (the decoder's max chunk; a multiple of 16 in 16..4096);
                               // BONSAI_CUDA_PREFILL_CHUNK. Round 18 (H200, 27b, same call, 3 reps): pp512 / pp2048
                               // 6,680 / 6,475 tok/s at 2048 vs 6,130 / 5,864 at 256 (1024: 6,683 / 6,388); round 4:
                               // 256 over 64
    int gemm3_occ = 5;         // round 17: v3's blocks per SM at 9..32 tokens (batched decode): 2 = two blocks of 7
                               // stages with 96-register consumers where the grid has more blocks than SMs (their warps
                               // hide each other's per-group latency; ternary_launches has the rule), 1 = always one
                               // block of 12 stages with 232-register consumers (H200, B = 16 / 32: 1,445 / 2,432 vs
                               // 1,309 / 2,268 tok/s); round 25: 3 / 4 = one block whose consumers double-buffer
                               // their accumulators (group kg + 1 issued before kg is scaled), with / without the
                               // turn-taking, 5 = two blocks where a product has >= 2 tiles per SM, else 4 (round
                               // 26, H200, same call: B = 16 / 32 1,530 / 2,563 vs 1,470 / 2,475 tok/s at 2);
                               // BONSAI_CUDA_GEMM3_OCC=1|2|3|4|5
    int gemm3_cvt = 1;         // v3's per-group int -> float: 1 = I2FP.F32.S32 (one instruction), 0 = the 1.5 x 2^23
                               // mantissa add (two); bit-identical results; 1 measured faster (H200 round 7: gate+up
                               // M256 234.6 vs 251.0 us, pp2048 2,592 vs 2,532 tok/s); BONSAI_CUDA_GEMM3_CVT
    bool gemm2_swizzle = true; // v2 operand tiles 128-byte swizzled (BONSAI_CUDA_GEMM2_SWIZZLE=0: no swizzle, slower)
    bool matvec_balance = true;  // M <= 2 matvec: row groups split evenly over one block per resident slot
                                 // (BONSAI_CUDA_MATVEC_BALANCE=0: fixed groups per warp, rounds 2-5)
    bool l2_prefetch = true;     // in a recorded decode step each M = 1 matvec prefetches the next one's weights
                                 // into L2 when it is done (BONSAI_CUDA_PREFETCH=0: off); docs/cuda-kernels.md round 6
    int act_levels = 2;        // int8 digits per activation element in the ternary products: 2 = q16 (default:
                               // passes the fixture gate), 1 = q8 (faster, fails it); BONSAI_CUDA_ACT=q16|q8.
                               // q8 only: the bulk matvec (matvec = 4) and fuse_site (v3 / the site kernel run
                               // in their place under q16)
    // ---- round 11, prefill (docs/cuda-kernels.md "Round 11: prefill") ----
    bool site_rows_pipe = true;   // round 28: prefill's row-unit sites on site_warp_rows_kernel (a block walks several
                                  // rows, the next row's chunk copied in while this one is transformed; bit-identical;
                                  // H200, same call: pp2048 7,143 / 7,136 vs 7,047 / 7,092 tok/s, pp512 +0.9 %);
                                  // BONSAI_CUDA_SITE_PIPE=0|1
    bool site_norm_warp = false;  // rmsnorm / add_rmsnorm of >= 64 rows fused into the warp site that reads them
                                  // (site_norm_warp_kernel, ternary.cu; needs fuse and site_warp): one launch instead
                                  // of norm_kernel + site_warp_kernel, bit-identical, but slower on the H200 (pp2048
                                  // 4,350 vs 4,398 tok/s, one call); BONSAI_CUDA_SITE_NORM_WARP=1: on
    bool gemm3_fold = true;       // round 11b: GEMM v3's split-K summed inside the GEMM by each split tile's last block
                                  // (no splitk_sum launch), and at >= one wave of tiles the last partial wave's tiles
                                  // split in K over the idle SMs (gemm3_fold_plan, gemm3_fold.h): pp2048 4,578 / 4,588
                                  // vs 4,513 / 4,536 tok/s in one H200 call (round 11's end); BONSAI_CUDA_GEMM3_FOLD=0: off
    // ---- round 13 ----
    int gemm_f16 = 0;             // GEMM v4 (gemm_f16.cu: the activation in fp16, each group's scale folded into fp16
                                  // weights, fp32 sums over all of K, no per-group scaling) for products of at least
                                  // this many tokens on sm_90a (0: never); looser than q16 (README, Parity);
                                  // BONSAI_CUDA_GEMMH=N
    bool gemm_f16_head = false;   // the output head too (its rounding goes straight into the logits; BONSAI_CUDA_GEMMH_HEAD=1)
    bool gemm_f16_all = false;    // at M <= 32 every product too, not only those of >= 200 rows per SM (the tests)
    int gemm_f16_tile = 0;        // its block shape: 0 = chosen per product (gemmh_plan), else cfg + 1 (kernels.h;
                                  // BONSAI_CUDA_GEMMH_TILE)
  };

  // Throws bonsai::Error when there is no usable CUDA device.
  CudaBackend();
  explicit CudaBackend(const Options& o);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  int64_t prefill_chunk() const override;  // Options::prefill_chunk
  void prepare(const Model& m) override;

  float* allocate(size_t n) override;
  void release(float* p) noexcept override;
  void zero(float* x, size_t n) override;
  void copy_to_host(const float* src, size_t n, float* host) override;
  void copy_from_host(const float* host, size_t n, float* dst) override;
  void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) override;
  void scale(float* x, size_t n, float s) override;

  void embed_rows(const TernaryMatrix& table, const int32_t* host_ids, int64_t M, float* out) override;
  void hadamard_forward(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) override;
  void hadamard_inverse(float* x, int64_t rows, int64_t K, const int8_t* signs, int64_t block) override;
  void permute_cols(const float* x, int64_t rows, int64_t K, const int32_t* perm, float* out) override;
  void linear(const LinearOut* outs, int n_outs, int64_t K, const float* x, int64_t M) override;
  void dense_linear(const float* w, int64_t N, int64_t K, const float* x, int64_t M, float* y) override;
  void rmsnorm(const float* x, int64_t rows, int64_t n, const float* gain, float eps, float* out) override;
  void add_rmsnorm(float* h, const float* delta, int64_t rows, int64_t n, const float* gain, float eps,
                   float* out) override;
  void l2norm_heads(float* x, int64_t rows, int64_t head_dim, float eps) override;
  void gated_rmsnorm(const float* o, const float* z, const float* gain, int64_t rows, int64_t Dv, float eps,
                     float* out) override;
  void rope_neox(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t p0,
                 float theta) override;
  void attention(const float* q, const float* k_cache, const float* v_cache, int64_t M, int64_t p0, int64_t Hq,
                 int64_t Hkv, int64_t D, float scale, float* out) override;
  void sigmoid_gate_mul(float* x, const float* gate, int64_t n) override;
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override;
  void gdn_conv(const float* x, float* conv_state, const float* taps, int64_t T, int64_t C, int64_t Kc,
                float* out) override;
  void gdn_gates(const float* a, const float* b, const float* A, const float* dt_bias, int64_t T, int64_t Nv,
                 float* g, float* beta) override;
  void gdn_delta_rule(float* state, const float* q, const float* k, const float* v, const float* g,
                      const float* beta, int64_t T, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                      float* out) override;

  // Batched decode (several sequences, one token each): one launch per op for up to
  // cuda::kMaxBatchRows rows (tables inline in the arguments), the Backend defaults above that.
  void rope_neox_rows(float* x, int64_t M, int64_t n_heads, int64_t head_dim, int64_t rot_dims, const int64_t* host_pos,
                      float theta) override;
  // One launch (attn_prep.cu) when fusion is on and the head fits (Dh <= 512); else the op sequence.
  void attention_prep(const AttnPrep& a) override;
  // Round 30 (Options::ffn_fused): one row as cuda::ffn_fused_launch, else the default op sequence.
  void swiglu_ffn(const TernaryMatrix& gate, const TernaryMatrix& up, const TernaryMatrix& down, const float* x, int64_t M,
                  float* fg, float* fu, float* delta, const int8_t* signs, int64_t block) override;
  void kv_write_rows(float* const* k_caches, float* const* v_caches, const int64_t* host_pos, const float* k,
                     const float* v, int64_t M, int64_t row) override;
  void attention_rows(const float* q, const float* const* k_caches, const float* const* v_caches,
                      const int64_t* host_pos, int64_t M, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                      float* out) override;
  void gdn_conv_rows(const float* x, float* const* conv_states, const float* taps, int64_t M, int64_t C, int64_t Kc,
                     float* out) override;
  void gdn_delta_rule_rows(float* const* states, const float* q, const float* k, const float* v, const float* g,
                           const float* beta, int64_t M, int64_t Nk, int64_t Nv, int64_t Dk, int64_t Dv,
                           float* out) override;

  // ---- CUDA extras (not in the Backend interface) ---------------------------------------------------
  // Index of the largest element of x [n] on the device (ref::argmax semantics; argmax_rows of one row, n <=
  // INT32_MAX); 4 bytes come back.
  int64_t argmax(const float* x, int64_t n);
  // Greedy batched decode: each row's argmax on the device (recorded into the step's graph), int32 [rows]
  // back to the host instead of the [rows, n] logits.
  bool argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* host_out) override;
  // Sampling's top-k pick on the device (sampling.cu): k <= 1024 candidates and <= 256 penalised tokens,
  // else -1 (the caller copies the logits); 4 + 8k bytes come back instead of the row.
  int64_t top_k(float* x, int64_t n, int32_t k, float penalty, const int32_t* penalized, int64_t n_penalized,
                int32_t* ids, float* values) override;
  // Ends the current step (launches a pending graph) and waits for the stream.
  void synchronize();
  // Switches graphs / pdl / fuse / tensor_cores between calls (the device cannot change).
  void set_options(const Options& o);
  Options options() const;
  // Uploads one ternary matrix (prepare() does this for every matrix of a model); idempotent.
  void prepare_matrix(const TernaryMatrix& w);
  // Frees the device copy of w (before w is destroyed, when its address could be reused).
  void release_matrix(const TernaryMatrix& w);
  // Device copy of host bytes, found again by the host address (what prepare() does for norm gains,
  // taps, signs, ...); for op tests that pass canonical host pointers. Idempotent per address. try_bf16: fp32 values
  // stored as bf16 where every one round-trips exactly (prepare()'s dense a / b projections).
  void upload_constant(const void* host, size_t bytes, bool try_bf16 = false);

  struct Stats {
    uint64_t weight_bytes = 0;       // device bytes of uploaded weights (ternary + constants)
    uint64_t kernels = 0;            // kernels issued (eager + recorded)
    uint64_t graph_builds = 0, graph_launches = 0, graph_patched_nodes = 0;  // graphs: per step shape
    uint64_t last_step_nodes = 0;    // kernels in the last recorded step
  };
  Stats stats() const;
  // Per-kernel table (launches, total ms, mean us) of the launches timed since the last report
  // (Options::profile; eager launches only), most expensive first.
  std::string profile_report();
  std::string device_name() const;
  int sm_count() const;
  // Whether linear() on a fresh x [rows, K] quantises it with one unit per row (Options::row_units where the prefill
  // warp site can: rows >= 64, K a multiple of 1024 up to 20,480); the tests' references follow it.
  bool row_quantised(int64_t rows, int64_t K) const;
  uint64_t device_free_bytes() const;
  uint64_t device_total_bytes() const;

  // ---- measurement helpers (bench / docs) -----------------------------------------------------------
  // Streaming-read bandwidth in GB/s over a fresh buffer of `bytes` (median of `reps` timed passes).
  double probe_read_gbs(uint64_t bytes, int reps);
  // Microseconds per hop between two dependent kernels (a graph of `launches` empty kernels with programmatic edges)
  // and per grid-wide barrier (one kernel of `rounds` barriers), one block per SM sized like matvec v7's
  // (sync_probe.cu; the best of 3 timed runs each).
  struct SyncCosts {
    double hop_us = 0, barrier_us = 0;
  };
  SyncCosts probe_sync_us(int launches, int rounds);
  // The int8 rate (TOP/s, 2 ops per MAC) of GEMM v3's consumer loop in mode cuda::WgmmaProbeMode, with no producer and
  // no memory traffic: the ceiling the loop itself sets (best of 3 runs, one block per SM).
  double probe_wgmma_tops(int mode, int groups);
  // Median microseconds of ONE ternary product kernel (no quantisation kernel) for x [M, K] random,
  // rotating over `mats` (each prepared) so the working set exceeds L2. n_outs outputs per launch
  // take mats[i*n_outs .. i*n_outs + n_outs) for launch i. pdl_between: programmatic edges between the
  // launches (each may start streaming while its predecessor drains), as in a decode step.
  double time_linear_kernel(const TernaryMatrix* const* mats, int n_mats, int n_outs, int64_t M, int reps,
                            bool pdl_between = false);
  // Round 24, diagnostic (builds with -DBONSAI_V7_TRACE; cuda::matvec7_trace_compiled): the same round of launches
  // (programmatic edges between them), run 3 times, each matvec v7 launch writing its blocks' timeline
  // (cuda::kV7TraceSlots u64 per block; kernels.h). Returns launch i's block b at [(i * blocks + b) * kV7TraceSlots]
  // from the last run (blocks: the launches' grid; empty when they are not all v7 or the trace is not compiled in).
  std::vector<uint64_t> trace_linear_kernel(const TernaryMatrix* const* mats, int n_mats, int n_outs, int64_t M,
                                            int& blocks);
  // Round 30 (ffn_fused.cu), its op test and kernel bench: the batch-1 FFN of n_ffn (gate, up, down) triples (mats: 3
  // n_ffn prepared matrices, gate / up [F, D], down [D, F]) on the host row x [D] (quantised by a plain site), with the
  // down input site's host signs [F] (or null) and Hadamard block n. fused: one cuda::ffn_fused_launch per FFN; else
  // today's three launches (the gate+up product, the SwiGLU row site, the ffn_down product) as the decode step picks
  // them. Returns the LAST FFN's gate / up rows gu [2F] and y [D] (fused: its chunk partials summed in chunk order
  // here) and, for reps > 0, the median us per FFN of `reps` runs of one graph of every FFN's launches with
  // programmatic edges between them. ran = false (nothing run) where the fused kernel does not support the shapes.
  struct FfnKernelRun {
    std::vector<float> gu, y;
    std::vector<int32_t> counters;  // fused: the group counters after the run (zero unless a launch left them dirty),
                                    // then (Options::ffn_reduce) the tile counters
    std::vector<float> parts_sum;   // fused: the host's sum of the last launch's chunk partials in chunk order (y is this
                                    // unless Options::ffn_reduce: then the kernel's own sum)
    double us = 0;
    bool ran = false;
  };
  // phases (fused, timing only): 3 the whole FFN; 1 / 2 gate+up / ffn_down alone, 0 neither, 4 / 12 probes (cuda::FfnFusedDesc::phases).
  FfnKernelRun run_ffn_kernel(const TernaryMatrix* const* mats, int n_ffn, const float* x, const int8_t* signs,
                              int64_t n, bool fused, int reps, int phases = 3);

 private:
  // The measurement helpers' round of ternary product launches over mats (x, y: its scratch, the caller releases them).
  std::vector<cuda::Launch> product_round(const TernaryMatrix* const* mats, int n_mats, int n_outs, int64_t M, float*& x,
                                          float*& y);
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// Number of CUDA devices the runtime sees (0 without a driver or a GPU; never throws).
int cuda_device_count();

// The factory the CLI uses for --backend cuda. Environment: BONSAI_CUDA_EXACT=1 (Options::exact),
// BONSAI_CUDA_FUSE_NORM=0, BONSAI_CUDA_GRAPHS=0, BONSAI_CUDA_PDL=0, BONSAI_CUDA_FUSE=0 (A/B switches), and each
// option's own word in its comment above (round 14's: BONSAI_CUDA_GRAPH_SEGMENT, BONSAI_CUDA_DELTA_STEP,
// BONSAI_CUDA_ATTN_LONG; round 15's: BONSAI_CUDA_MV7_K32, BONSAI_CUDA_MV7_FIRST).
// `activations` (the CLI's --act: "q8", "q16", "f16", "exact", or "" for the environment / default) overrides
// BONSAI_CUDA_ACT and BONSAI_CUDA_EXACT.
std::unique_ptr<Backend> make_cuda_backend(int device = 0, const std::string& activations = "");
// The options make_cuda_backend builds (the environment, then --act), without a device; throws bonsai::Error for an
// unknown precision (naming the known ones).
CudaBackend::Options cuda_options(int device = 0, const std::string& activations = "");

}  // namespace bonsai
