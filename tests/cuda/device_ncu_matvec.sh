#!/bin/bash
# Round 6: Nsight Compute on the M = 1 matvec inside the kernel bench (CudaBench.ProbeAndTernaryKernels with
# BONSAI_BENCH_SHAPE, BONSAI_BENCH_MAX_M=1): stall reasons (all of them: --print-details all), memory and
# scheduler sections, one launch each. Variant order in the bench per shape: q16 pdl (v3 balanced), q16 fixed
# pdl, q8 pdl, q8 v4; each runs (20 + 2) x copies launches, so --launch-skip picks the variant (round-6 run 3
# had the since-removed v5 variants after "q16 fixed pdl": down_v5d4 was --launch-skip 1518).
# Output: $OUT/ncu_<name>.txt.
set -u
source "$(dirname "$0")/device_env.sh"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
  --section MemoryWorkloadAnalysis --section InstructionStats --section LaunchStats"
prof() {  # name shape skip
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_MAX_M=1 BONSAI_BENCH_SHAPE="$2" timeout 150 ncu --clock-control none \
    -k regex:matvec_kernel --launch-skip "$3" --launch-count 1 $SECTIONS --print-details all \
    $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$OUT/ncu_$1.txt" 2>&1
  echo "== $1 rc=$?"
  grep -E "matvec_kernel<|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc A|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Stall|Executed Instructions  |Grid Size|Dynamic Shared" "$OUT/ncu_$1.txt" | grep -v "^ *$" | head -60
}
command -v ncu > /dev/null || { echo "no ncu"; exit 1; }
prof down_v3 ffn_down 0
prof down_fixed ffn_down 506
prof gateup_v3 "gate+up" 0
