// The batch-1 FFN in ONE launch (round 30): parts[c] = ffn_down[:, chunk c] . q(FWHT(signs . silu(gate x) . up x))[chunk
// c] for the F / 1,024 chunks c, summed by the kernel after it (the AddNorm site). Today's chain is three kernels with a
// grid-wide dependency between each (v7 gate+up -> the SwiGLU row site -> v7 ffn_down): ~34 us an FFN at batch 1 for
// 71 MB whose bytes take ~16 us at the read probe (docs/cuda-kernels.md, rounds 24 and 29).
//
// Why it splits: ffn_down's input site is blockwise (the Hadamard block is <= 1,024 and every int8 unit covers one
// 128-group), so the digits of columns [1,024 c, 1,024 c + 1,024) depend only on rows [1,024 c, 1,024 c + 1,024) of
// gate and up. Grid = one block per SM in C = F / 1,024 GROUPS of ~SMs / C blocks (block b in group b C / grid); group c:
//   phase A  gate and up rows of chunk c, split over the group's blocks in 8-row units (round 34, FfnPlanA: or over
//            ALL blocks, FfnArgs::balance): v7's step (matvec_mma.cu) on 16-row stages of one output through the
//            bulk-copy ring, warp w taking step w (D <= 5,120: one step a warp at most), the producer warp summing the
//            warps' partials in warp order into g / u: the same integer sums and float order as v7's gate+up
//            (bit-identical where v7 runs one step a warp).
//   barrier  the producer, once a run of gate / up rows is stored, fences and counts its 8-row units in on that chunk's
//            arrival counter; one consumer thread polls it until all 256 are in (a software barrier: a cluster of 7-8
//            one-block SMs packs only 2 to a GPC, so hardware clusters would leave SMs idle; tests/cuda/
//            cluster_ffn_probe.cu measures both).
//   site     consumer warps 0-3 compute the chunk's site from g / u into shared memory: silu(g) u, signs, the FWHT strides,
//            * 1 / sqrt(n), the int8 digits: warp_site.cuh's slot functions in site_row_kernel's order, so the digits
//            are that kernel's bit for bit.
//   phase B  the block's share of ffn_down's rows (8-row units of D), columns of chunk c only: 80-row stages of 256 B a
//            row (rows F / 4 bytes apart), warp w taking row block w / 4 and step w % 4 of each stage; the producer
//            sums a row block's 4 warps in warp order -> parts. The stage's copies (FfnArgs::b_copy, round 33): 0 a
//            bulk copy per row's words and one per its 8 scales (2 x 160 a stage: the first device run, H100, put the
//            kernel at 67 us an FFN against 42 for the three launches); 1 cp.async by the producer's lanes (16 B each,
//            the mbarrier counting them); 2 one 2-D tensor-map box for the words and one for the scales.
// The weights depend on nothing, so the producer streams phase B's stages right behind phase A's: they land while the
// group meets and the site is computed. Counters: arrivals (units) and departures (blocks) per group, zero before the
// first launch; the group's last block to depart zeroes both (the next launch touches them only after its pdl_wait,
// i.e. after this launch has completed).
#include <cuda.h>  // CUtensorMap and its encoder's signature (the encoder itself comes through the runtime)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/block_trace.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/matvec_step.cuh"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/warp_site.cuh"

namespace bonsai::cuda {
namespace {

constexpr int kFfnWarps = 20;                      // consumer warps; warp kFfnWarps is the producer
constexpr int kFfnBlocksB = kFfnWarps / 4;         // 16-row blocks of a warp set in phase B (4 steps of a 1,024 chunk)
constexpr int kFfnRowsB = 16 * kFfnBlocksB;        // 80 rows: a phase-B stage holds RBA such sets
constexpr int kFfnChunk = 1024;
constexpr int kFfnMaxStages = 8;
constexpr int kFfnSmem = 227 * 1024;               // an sm_90 block's most dynamic shared memory
constexpr int kFfnMaxGrid = 192;                   // balance != 0: the most blocks (SMs) its table holds
constexpr int kFfnMaxChunks = 64;                  // F / 1,024 at most with balance != 0
constexpr int kFfnTileUnits = 4;                   // FfnArgs::y's tiles: 4 8-row units = 32 rows, a lane a row
constexpr int kFfnReduceBatch = 24;                // its loads in flight a lane (one round trip up to 24 chunks)
constexpr int kFfnNoSite = 4, kFfnNoBarrier = 8;   // FfnArgs::phases' bench-only flags (with phases 0): the fixed part's parts

struct FfnArgs {
  CUtensorMap tm[4];      // b_copy 2: ffn_down's words u32 [D, F/16] and scales fp16 [D, F/128] as 2-D tensors, boxes of
                          // a whole phase-B stage's rows (0, 1) and of 8 rows (2, 3: a block's last, partial stage)
  const uint32_t* gw;     // gate words u32 [F, D/16]
  const uint16_t* gs;     // gate scales fp16 [F, D/128]
  const uint32_t* uw;     // up
  const uint16_t* us;
  const uint32_t* dw;     // down words u32 [D, F/16]
  const uint16_t* ds;     // down scales fp16 [D, F/128]
  const int8_t* xq;       // the input's digits int8 [LV, D] (transposed layout, ternary.cu)
  const float2* xds;      // [D/64]
  float* g;               // [F] gate rows (fp32; read back by the group's site)
  float* u;               // [F] up rows
  const int8_t* signs;    // [F] the down input site's signs, or null
  float* parts;           // [C, D] chunk c's share of y
  int32_t* count;         // [2 C] per group: arrivals, departures (zero between launches)
  uint64_t* trace;        // round 36, diagnostic: u64 [blocks, kV7TraceSlots] event times (kernels.h), or null
  float* y;               // round 37 (FfnFusedDesc::y): [D] the partials' sum, by the kernel's own tile reduction; or null
  int32_t* tile_count;    // [ceil(D / 32)] 8-row units stored per 32-row tile of D over all chunks (zero between launches)
  int64_t D, F;
  int32_t stages;         // ring depth
  int32_t stage_bytes;    // one stage: phase A words [16 RBA, D/4 B] then scales [16 RBA, D/64 B]; phase B words
                          // [80, 256 B] then scales [80, 16 B]
  int32_t log2n;          // the down site's Hadamard block n = 1 << log2n (<= 1,024)
  float norm;             // 1 / sqrt(n)
  int32_t b_copy;         // phase B's copies: 0 bulk per row, 1 cp.async by lanes, 2 tensor-map boxes
  int32_t phases;         // 3; the kernel bench's 1 (gate / up only), 2 (ffn_down only) or 0 (neither: the launch, the
                          // group barrier and the site alone) time a part (wrong output); 4 / 12 take the site / the
                          // site and the barrier off phase 0 too (kFfnNoSite, kFfnNoBarrier)
  int32_t balance;        // phase A's rows (FfnFusedDesc::balance): 0 the group's chunk over its blocks, else seq / perm
  int32_t release;        // 1: the barrier's arrival as one red.release by lane 0 (FfnFusedDesc::release; round 36)
  int32_t early;          // round 37 (FfnFusedDesc::early): stages the producer issues before its pdl_wait (>= ST: all
                          // the ring's, round 30's form)
  int32_t reserved;       // (zero: keeps the fields hole-free)
  uint16_t seq[2 * kFfnMaxGrid];  // balance != 0: block b's phase-A units are [seq[2 b], seq[2 b + 1]) of the sequence
  uint8_t perm[kFfnMaxChunks];    // balance != 0: the sequence's segment k holds chunk perm[k]
  uint8_t pos[kFfnMaxChunks];     // its inverse: chunk c is segment pos[c]
  uint8_t pad[72];        // explicit: sizeof is a multiple of the tensor maps' 128-byte alignment, no hidden padding
};
static_assert(offsetof(FfnArgs, pad) + sizeof(FfnArgs::pad) == sizeof(FfnArgs), "FfnArgs: no tail padding");
static_assert(offsetof(FfnArgs, gw) == sizeof(FfnArgs::tm) && offsetof(FfnArgs, D) == sizeof(FfnArgs::tm) + 16 * 8 &&
                  offsetof(FfnArgs, seq) == offsetof(FfnArgs, D) + 16 + 10 * 4 &&
                  offsetof(FfnArgs, perm) == offsetof(FfnArgs, seq) + sizeof(FfnArgs::seq) &&
                  offsetof(FfnArgs, pad) == offsetof(FfnArgs, pos) + kFfnMaxChunks,
              "FfnArgs: no holes between the fields (equal arguments must be equal bytes)");

// The shared memory's regions (byte offsets), one definition for the kernel and the launch's size: ring [ST][stage_bytes]
// | full [ST], empty [ST] (mbarriers) | red float [ST + 1][NW][TRA] (stage j's partials in slot j % (ST + 1), as v7) |
// xs int8 [LV][1,024] | xs_d float2 [16] | scratch float [128][8] | end. Every region after the mbarriers starts 16-byte
// aligned: xs is read as uint4 and scratch written as float4. (Round 35 put R more mbarriers there for fewer partials
// slots; an odd count left the regions after them 8 bytes off, a misaligned-address fault at the 27b shape. Measured
// slower, removed in round 36; the alignment stays explicit.)
struct FfnSmemLayout {
  int64_t full, red, xs, xs_d, scratch, end;
  __host__ __device__ static constexpr int64_t up16(int64_t x) { return (x + 15) & ~int64_t(15); }
  __host__ __device__ FfnSmemLayout(int ST, int64_t stage_bytes, int LV, int TRA) {
    full = int64_t(ST) * stage_bytes;
    red = up16(full + 16 * int64_t(ST));
    xs = red + int64_t(ST + 1) * kFfnWarps * TRA * 4;
    xs_d = up16(xs + int64_t(LV) * kFfnChunk);
    scratch = up16(xs_d + (kFfnChunk / 64) * 8);
    end = scratch + 128 * 8 * 4;
  }
};

// Group geometry: block b is in group b C / B; group c holds blocks [ceil(c B / C), ceil((c + 1) B / C)).
__host__ __device__ __forceinline__ void ffn_group(int b, int B, int C, int& c, int& r, int& gsize) {
  c = int(int64_t(b) * C / B);
  const int b0 = int((int64_t(c) * B + C - 1) / C), b1 = int((int64_t(c + 1) * B + C - 1) / C);
  r = b - b0;
  gsize = b1 - b0;
}

constexpr int kFfnSeg = kFfnChunk / 8;  // 8-row units of one output (gate or up) of one chunk

// Phase A's plan for one block. It works in 8-row units of the unit SEQUENCE: C segments of 256 units (a chunk's 128
// gate units, then its 128 up units), segment k holding chunk perm[k] (balance 0: chunk k). The block's units are up to
// three PIECES of it, each cut into sub-runs at the 128-unit (chunk, output) boundaries and those into stages of `su`
// units (2 RBA: 16 RBA rows). Every sub-run's units are counted in on its chunk's arrival counter once stored; a chunk's
// site waits for all 256.
//   balance 0: the group's chunk split over its blocks: units [ua0, ua1) of the gate half, then of the up half;
//   balance 1 / 2 (the host's table, make_balance_table): the block's range [seq[2 b], seq[2 b + 1]) of the sequence, the
//   part before its own chunk's segment first, then the part after it, its own units last: a group's helpers finish
//   its units early, so each chunk's barrier waits only for its own group's blocks.
// Host and device: the host test walks every block's plan (ffn_phase_a_plan).
struct FfnPlanA {
  const uint8_t* perm;  // FfnArgs::perm (balance != 0)
  int su, ua0, ua1, own0, S, E;
  bool bal;
  __host__ __device__ FfnPlanA(const FfnArgs& a, int b, int grid, int stage_units) {
    int c, r, gsize;
    ffn_group(b, grid, int(a.F / kFfnChunk), c, r, gsize);
    perm = a.perm;
    su = stage_units;
    bal = a.balance != 0;
    ua0 = kFfnSeg * r / gsize;
    ua1 = kFfnSeg * (r + 1) / gsize;
    own0 = 2 * kFfnSeg * (bal ? int(a.pos[c]) : c);  // the own chunk's segment [own0, own0 + 256)
    S = bal ? int(a.seq[2 * b]) : 0;
    E = bal ? int(a.seq[2 * b + 1]) : 0;
  }
  __host__ __device__ void piece(int k, int& p0, int& p1) const {
    const int own1 = own0 + 2 * kFfnSeg;
    if (!bal) {
      p0 = own0 + (k == 1 ? kFfnSeg : 0) + ua0;
      p1 = k < 2 ? p0 - ua0 + ua1 : p0;
    } else if (k == 0) {
      p0 = S, p1 = E < own0 ? E : own0;
    } else if (k == 1) {
      p0 = S > own1 ? S : own1, p1 = E;
    } else {
      p0 = S > own0 ? S : own0, p1 = E < own1 ? E : own1;
    }
    if (p1 < p0) p1 = p0;
  }
  // Stage k: its first sequence unit u and its sub-run [s0, s1); returns the stage count when k is past the last.
  __host__ __device__ int stage(int k, int& u, int& s0, int& s1) const {
    int ns = 0;
    for (int pc = 0; pc < 3; ++pc) {
      int p0, p1;
      piece(pc, p0, p1);
      for (int q0 = p0; q0 < p1;) {
        const int lim = (q0 / kFfnSeg + 1) * kFfnSeg, q1 = p1 < lim ? p1 : lim, m = (q1 - q0 + su - 1) / su;
        if (k < ns + m) {
          u = q0 + su * (k - ns);
          s0 = q0;
          s1 = q1;
          return ns;
        }
        ns += m;
        q0 = q1;
      }
    }
    return ns;
  }
  __host__ __device__ int stages() const {
    int u, s0, s1;
    return stage(1 << 30, u, s0, s1);
  }
  __host__ __device__ int chunk_of(int u) const { return bal ? int(perm[u / (2 * kFfnSeg)]) : u / (2 * kFfnSeg); }
  // Stage k's output (0 gate, 1 up), first row of that output's [F] rows, and rows.
  __host__ __device__ void rows(int k, int& o, int& r0, int& nrow) const {
    int u, s0, s1;
    stage(k, u, s0, s1);
    o = (u / kFfnSeg) & 1;
    r0 = chunk_of(u) * kFfnChunk + 8 * (u % kFfnSeg);
    nrow = 8 * (s1 - u < su ? s1 - u : su);
  }
  // Whether stage k is its sub-run's last (the sub-run's units are then counted in), and the sub-run.
  __host__ __device__ bool ends_run(int k, int& s0, int& s1) const {
    int u;
    stage(k, u, s0, s1);
    return u + su >= s1;
  }
};

// Round 37 (FfnArgs::y): the producer warp, its block's phase-B rows [8 ub0, 8 ub1) of parts[c] stored, counts them in on
// each 32-row tile of D they touch; the block whose count completes a tile (C x its units: every chunk's rows) sums the
// tile's C partials into y, lane l row l, in chunk order: the AddNorm site's order over parts (site_row_norm_kernel's
// PARTS), so y + resid there is the same bits. Its count is zeroed for the next launch (which reads it only after its
// pdl_wait). Why: the site after the FFN summed 17 partials through 5 SMs, latency-bound behind the next product's
// weight stream (9.2 us against 2.1 for one delta: round 37's chain trace); here the sums run in ~80 blocks at once.
__device__ __forceinline__ void reduce_tiles(const FfnArgs& a, int D, int C, int ub0, int ub1, int lane) {
  __syncwarp();  // every lane's parts stores before the lanes' releases (cumulative, as the barrier's arrival)
  const int U = D / 8, t0 = ub0 / kFfnTileUnits, t1 = (ub1 - 1) / kFfnTileUnits + 1;
  for (int tb = t0; tb < t1; tb += 32) {
    const int tile = tb + lane;
    bool last = false;
    if (tile < t1) {
      const int lo = max(ub0, tile * kFfnTileUnits), hi = min(ub1, (tile + 1) * kFfnTileUnits);
      const int want = C * (min(U, (tile + 1) * kFfnTileUnits) - tile * kFfnTileUnits);
      last = atom_add_acq_rel(a.tile_count + tile, hi - lo) + (hi - lo) == want;
    }
    // The completed tiles one by one, the whole warp on each (the winner's acquire, then the warp barrier, orders the
    // other lanes' L2 reads after every chunk's stores).
    for (unsigned m = __ballot_sync(~0u, last); m; m &= m - 1) {
      const int tl = tb + __ffs(int(m)) - 1, row = tl * 32 + lane;
      __syncwarp();
      if (row < D) {
        float v = __ldcg(a.parts + row);
        for (int c0 = 1; c0 < C; c0 += kFfnReduceBatch) {
          float p[kFfnReduceBatch];
#pragma unroll
          for (int q = 0; q < kFfnReduceBatch; ++q)
            if (c0 + q < C) p[q] = __ldcg(a.parts + int64_t(c0 + q) * D + row);
#pragma unroll
          for (int q = 0; q < kFfnReduceBatch; ++q)
            if (c0 + q < C) v += p[q];
        }
        a.y[row] = v;
      }
      if (lane == 0) a.tile_count[tl] = 0;
    }
  }
}

// RBA: 16-row blocks a warp takes per stage, 1 or 2: phase A's stages of 16 RBA rows (2: as v7's gate+up), phase B's of
// 80 RBA rows (warp w: row blocks w / 4 + 5 b, b < RBA), so both phases' stages fill the same ring slots.
template <int LV, int RBA>
__global__ __launch_bounds__((kFfnWarps + 1) * 32, 1) void ffn_fused_kernel(const __grid_constant__ FfnArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int NW = kFfnWarps, TRA = 16 * RBA;  // TRA: rows of a phase-A stage, and of a warp's red row
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int D = int(a.D), C = int(a.F / kFfnChunk), ST = a.stages;
  int c, r, gsize;
  ffn_group(int(blockIdx.x), int(gridDim.x), C, c, r, gsize);
  // Phase A: FfnPlanA (above); phase B: units [ub0, ub1) of D / 8 (the group's chunk).
  const FfnPlanA plan(a, int(blockIdx.x), int(gridDim.x), 2 * RBA);
  const int ub0 = int(int64_t(D / 8) * r / gsize), ub1 = int(int64_t(D / 8) * (r + 1) / gsize);
  const int na_all = plan.stages();
  constexpr int UB = 2 * kFfnBlocksB * RBA;  // 8-row units of a phase-B stage
  const int nA = (a.phases & 1) ? na_all : 0, nB = (a.phases & 2) ? (ub1 - ub0 + UB - 1) / UB : 0, n = nA + nB;
  const bool barrier = !(a.phases & kFfnNoBarrier), site = !(a.phases & kFfnNoSite);  // both, but in the bench's probes
  // Stage i: output o (0 gate, 1 up, 2 down), its first row, its rows.
  auto stage_at = [&](int i, int& o, int& r0, int& nrow) {
    if (i < nA) {
      plan.rows(i, o, r0, nrow);
    } else {
      o = 2;
      const int u = ub0 + UB * (i - nA);
      r0 = 8 * u;
      nrow = 8 * min(UB, ub1 - u);
    }
  };
  // Shared memory (FfnSmemLayout): ring [ST][stage_bytes] | full [ST], empty [ST] | red float [ST + 1][NW][TRA] |
  // xs int8 [LV][1,024] then xds float2 [16] (the chunk's digits) | scratch float [128][8] (the site's strides 256 / 512).
  const FfnSmemLayout lay(ST, a.stage_bytes, LV, TRA);
  unsigned char* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + lay.full);
  uint64_t* empty = full + ST;
  float* red = reinterpret_cast<float*>(smem + lay.red);
  int8_t* xs = reinterpret_cast<int8_t*>(smem + lay.xs);
  float2* xs_d = reinterpret_cast<float2*>(smem + lay.xs_d);
  float* scratch = reinterpret_cast<float*>(smem + lay.scratch);
  if (threadIdx.x == 0) {
    BLOCK_TRACE(a.trace, kV7TrStart);
    BLOCK_TRACE_VALUE(a.trace, kV7TrStages, n);
    for (int s = 0; s < ST; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], unsigned(NW));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_trigger();
  const int G = D >> 7;  // phase A's 128-groups a row
  int32_t* arrivals = a.count + 2 * c;

  if (w == NW) {  // ---- producer: copies ST stages ahead; sums each stage once it is consumed ----
    bool waited = false;
    auto wait_once = [&] {
      if (!waited) {
        pdl_wait();  // g / u / parts / the counters may still be used by earlier kernels
        if (lane == 0) BLOCK_TRACE(a.trace, kV7TrProducerWaited);
      }
      waited = true;
    };
    // Sub-run [s0, s1)'s rows are stored: count its units in on its chunk. Every lane's stores fenced first, then a
    // relaxed add; or (a.release, round 36) one release by lane 0 after the warp barrier, which orders every lane's
    // stores before it (a release is cumulative: CUTLASS's generic barrier does the same after a block barrier), one
    // L2 round trip fewer than a fence.sc in every lane (round 29's probe: 2.39 against 2.69 us a grid barrier).
    auto arrive = [&](int s0, int s1) {
      wait_once();
      int32_t* cnt = a.count + 2 * plan.chunk_of(s0);
      if (a.release) {
        __syncwarp();
        if (lane == 0) red_release_add(cnt, s1 - s0);
      } else {
        __threadfence();
        __syncwarp();
        if (lane == 0) atomicAdd(cnt, s1 - s0);
      }
    };
    if (nA == 0 && barrier)  // (the bench's phases without gate / up: every sub-run counted in at once)
      for (int k = 0; k < na_all; ++k) {
        int s0, s1;
        if (plan.ends_run(k, s0, s1)) arrive(s0, s1);
      }
    int s = 0, es = 0, slot = 0;
    unsigned eph = 0;
    for (int i = 0; i < n + ST; ++i) {
      if (i >= ST) {
        mbar_wait(&empty[es], eph);  // stage i - ST consumed
        if (lane == 0 && i - ST < kV7TrMaxStages) BLOCK_TRACE(a.trace, kV7TrEmpty0 + i - ST);
      }
      if (i < n) {
        // Round 37: the first `early` stages stream before the wait, the rest after it: a ring's worth of copies in
        // flight while the kernel before this one completes may delay its completion (its last stores queue behind them).
        if (i == a.early) wait_once();
        int o, r0, nrow;
        stage_at(i, o, r0, nrow);
        unsigned char* st = ring + size_t(s) * a.stage_bytes;
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the consumers' reads of this slot first
        if (o < 2) {  // nrow rows x D: one contiguous run of words and one of scales
          const unsigned wbytes = unsigned(nrow) * unsigned(D >> 2), sbytes = unsigned(nrow) * unsigned(D >> 6);
          if (lane == 0) {
            mbar_expect_tx(&full[s], wbytes + sbytes);
            bulk_load(st, (o ? a.uw : a.gw) + int64_t(r0) * (D >> 4), wbytes, &full[s]);
            bulk_load(st + TRA * (D >> 2), (o ? a.us : a.gs) + int64_t(r0) * G, sbytes, &full[s]);
          }
        } else {  // nrow rows x the chunk's 1,024 columns: 256 B of words and 16 B of scales a row
          const int64_t wrow = a.F >> 4, srow = a.F >> 7;  // u32 / fp16 per row of ffn_down
          unsigned char* ss = st + RBA * kFfnRowsB * 256;  // the stage's scales [rows][16 B]
          if (a.b_copy == 1) {  // 16 B a lane and copy; each lane's copies raise the phase's count until they land
            for (int k = lane; k < nrow * 16; k += 32)
              cp_async16_s(smem_u32(st) + 16 * k, a.dw + (r0 + (k >> 4)) * wrow + 64 * c + 4 * (k & 15), 16);
            for (int rr = lane; rr < nrow; rr += 32) cp_async16_s(smem_u32(ss) + 16 * rr, a.ds + (r0 + rr) * srow + 8 * c, 16);
            cp_async_arrive_inc(smem_u32(&full[s]));
            __syncwarp();
            if (lane == 0) mbar_arrive(&full[s]);  // the phase's one counted arrival, after every lane's increment
          } else if (a.b_copy == 2) {  // whole-stage boxes, or 8-row ones for a partial stage (nrow % 8 == 0)
            if (lane == 0) {
              mbar_expect_tx(&full[s], unsigned(nrow) * 272u);
              const bool whole = nrow == 8 * UB;
              for (int rr = 0; rr < nrow; rr += whole ? nrow : 8) {
                tensor_load_2d(smem_u32(st + rr * 256), &a.tm[whole ? 0 : 2], 64 * c, r0 + rr, smem_u32(&full[s]));
                tensor_load_2d(smem_u32(ss + rr * 16), &a.tm[whole ? 1 : 3], 8 * c, r0 + rr, smem_u32(&full[s]));
              }
            }
          } else {
            if (lane == 0) mbar_expect_tx(&full[s], unsigned(nrow) * 272u);
            __syncwarp();
            for (int rr = lane; rr < nrow; rr += 32) {
              bulk_load(st + rr * 256, a.dw + (r0 + rr) * wrow + 64 * c, 256u, &full[s]);
              bulk_load(ss + rr * 16, a.ds + (r0 + rr) * srow + 8 * c, 16u, &full[s]);
            }
          }
        }
        __syncwarp();
        if (lane == 0 && i == 0) BLOCK_TRACE(a.trace, kV7TrIssued);
        if (++s == ST) s = 0;
      }
      if (i >= ST) {
        wait_once();
        const int j = i - ST;
        int o, r0, nrow;
        stage_at(j, o, r0, nrow);
        const float* p = red + size_t(slot) * NW * TRA;  // [NW][TRA]
        if (o < 2) {  // every warp's partial of the stage's <= 32 rows, in warp order
          if (lane < nrow) {
            float pv[NW];
#pragma unroll
            for (int ww = 0; ww < NW; ++ww) pv[ww] = p[ww * TRA + lane];
            float v = 0.f;
#pragma unroll
            for (int ww = 0; ww < NW; ++ww) v += pv[ww];
            (o ? a.u : a.g)[r0 + lane] = v;
          }
        } else {  // row rr: row block k = rr / 16 is warps 4 (k % 5) .. + 3's block k / 5; its 4 steps in warp order
          for (int rr = lane; rr < nrow; rr += 32) {
            const int k = rr >> 4;
            const float* q = p + (k % kFfnBlocksB) * 4 * TRA + 16 * (k / kFfnBlocksB) + (rr & 15);
            a.parts[int64_t(c) * D + r0 + rr] = ((q[0] + q[TRA]) + q[2 * TRA]) + q[3 * TRA];
          }
        }
        __syncwarp();  // every lane's reads of this red slot before the next arrive that lets it be rewritten
        int s0, s1;
        if (j < nA && plan.ends_run(j, s0, s1)) arrive(s0, s1);  // the sub-run's last stage
        if (++es == ST) es = 0, eph ^= 1u;
        if (++slot == ST + 1) slot = 0;
      }
    }
    wait_once();
    if (a.y && nB > 0) reduce_tiles(a, D, C, ub0, ub1, lane);
    if (lane == 0) BLOCK_TRACE(a.trace, kV7TrDone);
    return;
  }

  // ---- consumers ----
  pdl_wait();  // the input's digits depend on earlier kernels
  if (threadIdx.x == 0) BLOCK_TRACE(a.trace, kV7TrConsumerWaited);
  const Mv7OneToken<LV> ln(lane);
  const int g = ln.g, t = ln.t;
  uint4 XP[4];
  float4 xv0, xv1;
  int s = 0, slot = 0;
  unsigned ph = 0;
  auto next = [&] {
    __syncwarp();  // every lane's reads of the stage and writes of red before lane 0's arrive (a release)
    if (lane == 0) mbar_arrive(&empty[s]);
    if (++s == ST) s = 0, ph ^= 1u;
    if (++slot == ST + 1) slot = 0;
  };
  // Phase A: K = D, S = G / 2 <= NW steps a row (ffn_fused_supported); warp w takes step w (none past S), its B read
  // once.
  const int SA = (G + 1) >> 1;
  ln.load_b(w, D, a.xq, a.xds, XP, xv0, xv1);
  if (threadIdx.x == 0) BLOCK_TRACE(a.trace, kV7TrStaged);
  for (int j = 0; j < nA; ++j) {
    mbar_wait(&full[s], ph);
    if (threadIdx.x == 0 && j < kV7TrMaxStages) BLOCK_TRACE(a.trace, kV7TrFull0 + j);
    const unsigned char* st = ring + size_t(s) * a.stage_bytes;
    const unsigned char* wrow = st + g * (D >> 2) + 16 * t;
    const uint16_t* srow = reinterpret_cast<const uint16_t*>(st + TRA * (D >> 2)) + g * G + (LV == 2 ? (t & 1) : 0);
    float yg[RBA] = {}, yg8[RBA] = {};
    if (w < SA) mv7_window_step<LV, RBA>(wrow, 16 * (D >> 2), D >> 2, srow, 16 * G, G, G, w, t, XP, xv0, xv1, yg, yg8);
    mv7_put_rows<LV, RBA>(red + (size_t(slot) * NW + w) * TRA + g, ln.holder, yg, yg8);
    next();
  }
  if (threadIdx.x == 0) BLOCK_TRACE(a.trace, kFfnTrLastA);
  // The group's barrier, then the chunk's site (warps 0-3: 128 slots of 8 elements) into xs / xs_d.
  if (w < 4) {
    const int tt = threadIdx.x;  // slot 0..127
    if (tt == 0 && barrier) {
      poll_until_at_least(arrivals, 2 * kFfnSeg);  // all the chunk's gate and up units
      BLOCK_TRACE(a.trace, kFfnTrPolled);
      depart_and_reset(arrivals, gsize);
    }
    asm volatile("bar.sync 2, 128;" ::: "memory");
    if (site) {
      const int e = 8 * tt;  // chunk-local element of the slot
      const float* gp = a.g + int64_t(c) * kFfnChunk + e;
      const float* up = a.u + int64_t(c) * kFfnChunk + e;
      float v[8], u[8];
      {  // L2 reads (other blocks wrote them in this launch)
        const float4 g0 = __ldcg(reinterpret_cast<const float4*>(gp)),
                     g1 = __ldcg(reinterpret_cast<const float4*>(gp) + 1);
        const float4 u0 = __ldcg(reinterpret_cast<const float4*>(up)),
                     u1 = __ldcg(reinterpret_cast<const float4*>(up) + 1);
        v[0] = g0.x, v[1] = g0.y, v[2] = g0.z, v[3] = g0.w, v[4] = g1.x, v[5] = g1.y, v[6] = g1.z, v[7] = g1.w;
        u[0] = u0.x, u[1] = u0.y, u[2] = u0.z, u[3] = u0.w, u[4] = u1.x, u[5] = u1.y, u[6] = u1.z, u[7] = u1.w;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = siluf_(v[k]) * u[k];  // site_slot_front's SiluMul, the same expression
      SitePrologue sp{};
      sp.pre = kPreNone;
      sp.signs = a.signs ? a.signs + int64_t(c) * kFfnChunk : nullptr;
      sp.log2n = a.log2n;
      sp.norm = a.norm;
      site_slot_front(sp, e, lane, 0.f, true, nullptr, v);  // signs, strides 1 .. min(n, 256) / 2
      const int nn = 1 << a.log2n;
      if (nn > 256) {
        store8(scratch + tt * 8, v);
        asm volatile("bar.sync 2, 128;" ::: "memory");
        site_slot_exchange(nn, w, lane, scratch, v);
      }
      site_slot_quantise<LV>(sp, kFfnChunk, e, lane, nullptr, xs, xs_d, v);
    }  // site
  }
  asm volatile("bar.sync 1, %0;" ::"r"(NW * 32) : "memory");  // the chunk's digits are in xs / xs_d
  if (threadIdx.x == 0) BLOCK_TRACE(a.trace, kFfnTrSite);
  // Phase B: a stage is RBA x 5 row blocks x the chunk's 4 steps; warp w takes row blocks w / 4 + 5 b, step w % 4.
  const int rb = w >> 2, cc = w & 3;
  ln.load_b(cc, kFfnChunk, xs, xs_d, XP, xv0, xv1);
  for (int j = 0; j < nB; ++j) {
    mbar_wait(&full[s], ph);
    if (threadIdx.x == 0 && j == 0) BLOCK_TRACE(a.trace, kFfnTrFullB);
    if (threadIdx.x == 0 && nA + j < kV7TrMaxStages) BLOCK_TRACE(a.trace, kV7TrFull0 + nA + j);
    const unsigned char* st = ring + size_t(s) * a.stage_bytes;
    const unsigned char* wrow = st + (16 * rb + g) * 256 + 16 * t;
    const uint16_t* srow =
        reinterpret_cast<const uint16_t*>(st + RBA * kFfnRowsB * 256) + (16 * rb + g) * 8 + (LV == 2 ? (t & 1) : 0);
    float yg[RBA] = {}, yg8[RBA] = {};
    mv7_window_step<LV, RBA>(wrow, kFfnRowsB * 256, 256, srow, kFfnRowsB * 8, 8, kFfnChunk >> 7, cc, t, XP, xv0, xv1, yg,
                            yg8);
    mv7_put_rows<LV, RBA>(red + (size_t(slot) * NW + w) * TRA + g, ln.holder, yg, yg8);
    next();
  }
}

const void* ffn_fused_kernel_for(int lv, int rows_a) {
  return lv == 2 ? (rows_a == 32 ? reinterpret_cast<const void*>(&ffn_fused_kernel<2, 2>)
                                 : reinterpret_cast<const void*>(&ffn_fused_kernel<2, 1>))
                 : (rows_a == 32 ? reinterpret_cast<const void*>(&ffn_fused_kernel<1, 2>)
                                 : reinterpret_cast<const void*>(&ffn_fused_kernel<1, 1>));
}

struct FfnShape {
  int stages = 0;
  int64_t stage_bytes = 0, smem = 0;
};
FfnShape ffn_shape(int64_t D, int levels, int rows_a) {
  FfnShape f;
  f.stage_bytes = std::max<int64_t>(rows_a * (D / 4 + D / 64), rows_a / 16 * kFfnRowsB * (256 + 16));
  for (int st = kFfnMaxStages; st >= 2; --st) {
    const int64_t bytes = FfnSmemLayout(st, f.stage_bytes, levels, rows_a).end;
    if (bytes <= kFfnSmem) {
      f.stages = st;
      f.smem = bytes;
      break;
    }
  }
  return f;
}

// The phase-A table of balance 1 / 2 (FfnArgs::seq / perm / pos): block b's units of the sequence.
//   1: every block the same share (256 C / B units), the segments in chunk order.
//   2: every block the same share of BOTH phases' bytes: a phase-B unit (8 rows x 1,024 of ffn_down) weighs 1,024 / D
//      of a phase-A one (8 rows x D; times FfnFusedDesc::balance_weight, 1 = by bytes), so a block of a 7-block group
//      (~14 % more ffn_down rows than one of 8) takes that much fewer gate / up units; a group's blocks then carry
//      != 256 units, and the segments are ordered greedily to keep the running difference near zero, so a group's
//      range overlaps only its neighbours' segments by part of a block (whose foreign units come first: the kernel's
//      piece order).
struct BalanceTable {
  uint16_t seq[2 * kFfnMaxGrid];
  uint8_t perm[kFfnMaxChunks], pos[kFfnMaxChunks];
};
BalanceTable make_balance_table(int mode, float weight, int B, int C, int64_t D) {
  BalanceTable t{};
  const int units = 2 * 128 * C;
  std::vector<double> share(size_t(B), double(units) / B);
  std::vector<int> first(size_t(C) + 1);
  for (int c = 0; c <= C; ++c) first[size_t(c)] = int((int64_t(c) * B + C - 1) / C);
  if (mode == 2) {
    const double w = weight * 1024.0 / double(D), total = units + w * double(C) * double(D / 8);
    for (int b = 0; b < B; ++b) {
      int c, r, gs;
      ffn_group(b, B, C, c, r, gs);
      const int64_t ub = (D / 8) * (r + 1) / gs - (D / 8) * r / gs;
      share[size_t(b)] = total / B - w * double(ub);
    }
  }
  std::vector<int> order(static_cast<size_t>(C));  // segment k holds chunk order[k]
  std::vector<bool> used(size_t(C), false);
  double cum = 0.0;
  for (int k = 0; k < C; ++k) {
    int best = -1;
    double best_d = 0.0;
    for (int c = 0; c < C; ++c) {
      if (used[size_t(c)]) continue;
      double t = -256.0;
      for (int b = first[size_t(c)]; b < first[size_t(c) + 1]; ++b) t += share[size_t(b)];
      if (mode == 1) {  // chunk order
        best = c, best_d = t;
        break;
      }
      if (best < 0 || std::abs(cum + t) < std::abs(cum + best_d)) best = c, best_d = t;
    }
    used[size_t(best)] = true;
    order[size_t(k)] = best;
    cum += best_d;
  }
  double x = 0.0;
  for (int k = 0; k < C; ++k) {
    const int c = order[size_t(k)];
    t.perm[k] = uint8_t(c);
    t.pos[c] = uint8_t(k);
    for (int b = first[size_t(c)]; b < first[size_t(c) + 1]; ++b) {
      const int lo = int(std::lround(x));
      x += share[size_t(b)];
      const int hi = (k == C - 1 && b == first[size_t(c) + 1] - 1) ? units : int(std::lround(x));
      t.seq[2 * b] = uint16_t(lo);
      t.seq[2 * b + 1] = uint16_t(std::max(lo, hi));
    }
  }
  return t;
}

// a.balance and, for balance 1 / 2, its table: built once per (mode, weight, SMs, shape), since the backend rebuilds
// every launch record each decode token (as down_maps, below).
void put_balance(FfnArgs& a, const FfnFusedDesc& d, int sms) {
  a.balance = d.balance;
  if (d.balance == 0) return;
  using Key = std::tuple<int, float, int, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, BalanceTable> cache;
  const Key key{d.balance, d.balance_weight, sms, d.F, d.D};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, make_balance_table(d.balance, d.balance_weight, sms, int(d.F / kFfnChunk), d.D)).first;
  std::memcpy(a.seq, it->second.seq, sizeof a.seq);
  std::memcpy(a.perm, it->second.perm, sizeof a.perm);
  std::memcpy(a.pos, it->second.pos, sizeof a.pos);
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda: CI and the host tests load
// without a driver); null where there is none.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// One 2-D map of a row-major matrix [rows][cols] of `elem`-byte elements, boxes of box_cols x box_rows.
void encode_rows(CUtensorMap& m, CUtensorMapDataType type, int elem, const void* base, int64_t rows, int64_t cols,
                 uint32_t box_cols, uint32_t box_rows, const char* what) {
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols * elem)};
  const cuuint32_t box[2] = {box_cols, box_rows}, estr[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, type, 2, const_cast<void*>(base), dims, strides, box, estr,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string("ffn_fused: cuTensorMapEncodeTiled failed for ffn_down's ") + what +
                             " (error " + std::to_string(int(r)) + ")");
}

// ffn_down's four maps (words, scales; boxes of a whole phase-B stage, 80 rows_a / 16 rows, and of 8 rows), encoded
// once per matrix and stage shape: the backend rebuilds every launch record each decode token (the graph's nodes are
// patched by comparing bytes), and 64 FFNs x 4 encodes a token would be host work on the step's path. The key holds
// every input of the encoding, so a hit is always the map that encoding would give.
void down_maps(const FfnFusedDesc& d, CUtensorMap (&tm)[4]) {
  struct Key {
    const void* words;
    const void* scales;
    int64_t D, F;
    int32_t rows_a;
    bool operator==(const Key& o) const {
      return words == o.words && scales == o.scales && D == o.D && F == o.F && rows_a == o.rows_a;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.words) ^ (std::hash<const void*>()(k.scales) * 31) ^
             std::hash<int64_t>()(k.D * 1000003 + k.F * 131 + k.rows_a);
    }
  };
  struct Maps {
    CUtensorMap tm[4];
  };
  static std::mutex mu;
  static std::unordered_map<Key, Maps, KeyHash> cache;
  const Key key{d.down.words, d.down.scales, d.D, d.F, d.rows_a};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    Maps m{};
    const uint32_t whole = uint32_t(d.rows_a / 16 * kFfnRowsB);
    for (int b = 0; b < 2; ++b) {
      const uint32_t rows = b == 0 ? whole : 8u;
      encode_rows(m.tm[2 * b], CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, d.down.words, d.D, d.F / 16, 64, rows, "words");
      encode_rows(m.tm[2 * b + 1], CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, d.down.scales, d.D, d.F / 128, 8, rows, "scales");
    }
    it = cache.emplace(key, m).first;
  }
  std::memcpy(tm, it->second.tm, sizeof tm);
}

}  // namespace

bool ffn_fused_tensor_maps_available() { return tensor_map_encoder() != nullptr; }

bool ffn_fused_set_trace(Launch& l, uint64_t* trace) {
  if (!kBlockTraceCompiled || l.size != sizeof(FfnArgs)) return false;
  bool fused = false;
  for (const int lv : {1, 2})
    for (const int rows : {16, 32}) fused = fused || l.func == ffn_fused_kernel_for(lv, rows);
  if (!fused) return false;
  set_arg_field(l, &FfnArgs::trace, trace);
  return true;
}

FfnSmemRegions ffn_smem_regions(const FfnFusedDesc& d) {
  const FfnShape sh = ffn_shape(d.D, d.levels, d.rows_a);
  FfnSmemRegions r;
  if (sh.stages == 0) return r;
  const FfnSmemLayout lay(sh.stages, sh.stage_bytes, d.levels, d.rows_a);
  r.stages = sh.stages, r.stage_bytes = sh.stage_bytes;
  r.full = lay.full, r.red = lay.red, r.xs = lay.xs, r.xs_d = lay.xs_d, r.scratch = lay.scratch, r.end = lay.end;
  return r;
}

std::vector<FfnStageA> ffn_phase_a_plan(const FfnFusedDesc& d, int sms, int block) {
  std::vector<FfnStageA> out;
  if (!ffn_fused_shape_ok(d, sms) || block < 0 || block >= sms) return out;
  FfnArgs a{};
  a.F = d.F;
  put_balance(a, d, sms);
  const FfnPlanA plan(a, block, sms, d.rows_a / 8);
  for (int k = 0, n = plan.stages(); k < n; ++k) {
    FfnStageA st;
    plan.rows(k, st.output, st.row, st.rows);
    int s0, s1;
    if (plan.ends_run(k, s0, s1)) st.arrive_chunk = plan.chunk_of(s0), st.arrive_units = s1 - s0;
    out.push_back(st);
  }
  return out;
}

FfnBalanceTable ffn_balance_table(const FfnFusedDesc& d, int sms) {
  FfnBalanceTable t;
  if (d.balance == 0 || !ffn_fused_shape_ok(d, sms)) return t;
  FfnArgs a{};
  const int C = int(d.F / kFfnChunk);
  put_balance(a, d, sms);
  for (int b = 0; b < sms; ++b) {
    t.lo.push_back(a.seq[2 * b]);
    t.hi.push_back(a.seq[2 * b + 1]);
  }
  for (int k = 0; k < C; ++k) t.perm.push_back(a.perm[k]);
  return t;
}

void init_ffn_fused_attributes() {
  for (const void* f : {ffn_fused_kernel_for(1, 16), ffn_fused_kernel_for(1, 32), ffn_fused_kernel_for(2, 16),
                        ffn_fused_kernel_for(2, 32)})
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kFfnSmem) != cudaSuccess)
      (void)cudaGetLastError();  // no device here (host-only tests): the launch itself would report it
}

bool ffn_fused_shape_ok(const FfnFusedDesc& d, int sms) {
  const int64_t C = d.F / kFfnChunk;
  return d.D >= 1024 && d.D % 1024 == 0 && d.D / 256 <= kFfnWarps && d.F >= kFfnChunk && d.F % kFfnChunk == 0 &&
         C <= sms && sms / C <= kFfnChunk / 8 && d.n >= 1 && d.n <= kFfnChunk && (d.n & (d.n - 1)) == 0 &&
         (d.levels == 1 || d.levels == 2) && (d.rows_a == 16 || d.rows_a == 32) &&
         ffn_shape(d.D, d.levels, d.rows_a).stages >= 2 &&
         d.b_copy >= 0 && d.b_copy <= 2 &&
         ((d.phases >= 0 && d.phases <= 3) || d.phases == kFfnNoSite || d.phases == (kFfnNoSite | kFfnNoBarrier)) &&
         (d.b_copy != 2 || ffn_fused_tensor_maps_available()) && d.balance >= 0 && d.balance <= 2 &&
         (d.balance == 0 || (sms <= kFfnMaxGrid && C <= kFfnMaxChunks && d.balance_weight >= 0.f &&
                             d.balance_weight <= 4.f));
}

bool ffn_fused_supported(const FfnFusedDesc& d, int sms) {
  return ffn_fused_shape_ok(d, sms) && d.gate.words && d.up.words && d.down.words && d.xq && d.xds && d.g && d.u &&
         d.parts && d.count && aligned16(d.g) && aligned16(d.u) && aligned16(d.parts) && (!d.y) == (!d.tile_count) &&
         (!d.y || d.phases == 3);
}

Launch ffn_fused_launch(const FfnFusedDesc& d, int sms) {
  const FfnShape sh = ffn_shape(d.D, d.levels, d.rows_a);
  FfnArgs a{};
  a.gw = d.gate.words;
  a.gs = d.gate.scales;
  a.uw = d.up.words;
  a.us = d.up.scales;
  a.dw = d.down.words;
  a.ds = d.down.scales;
  a.xq = d.xq;
  a.xds = d.xds;
  a.g = d.g;
  a.u = d.u;
  a.signs = d.signs;
  a.parts = d.parts;
  a.count = d.count;
  a.y = d.y;
  a.tile_count = d.tile_count;
  a.D = d.D;
  a.F = d.F;
  a.stages = sh.stages;
  a.stage_bytes = int32_t(sh.stage_bytes);
  while ((int64_t(1) << a.log2n) < d.n) ++a.log2n;
  a.norm = float(1.0 / __builtin_sqrt(double(d.n)));
  a.b_copy = d.b_copy;
  a.phases = d.phases;
  a.release = d.release ? 1 : 0;
  a.early = d.early < 0 ? sh.stages : d.early;
  put_balance(a, d, sms);
  if (d.b_copy == 2) down_maps(d, a.tm);
  const void* f = ffn_fused_kernel_for(d.levels, d.rows_a);
  return make_launch(f, dim3(unsigned(sms)), dim3(unsigned(32 * (kFfnWarps + 1))), uint32_t(sh.smem), a);
}

}  // namespace bonsai::cuda
