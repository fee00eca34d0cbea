#!/bin/bash
# Round 8: Nsight Compute on the matvec v6 (matvec_mma.cu) inside the kernel bench, one launch per (shape, variant
# tag) of PROFS ("name:shape:tag;..."): speed of light, stall reasons, scheduler, occupancy, memory, instruction mix.
# Output: $OUT/ncu_<name>.txt.
set -u
source "$(dirname "$0")/device_env.sh"
command -v ncu > /dev/null || { echo "no ncu"; exit 1; }
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
  --section MemoryWorkloadAnalysis --section InstructionStats"
IFS=';' read -ra PS <<< "${PROFS:-gate_c3:ffn_gate:q16 v6c3 pdl;down_c2:ffn_down:q16 v6c2 pdl}"
for p in "${PS[@]}"; do
  IFS=':' read -r name shape tag <<< "$p"
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_MAX_M=1 BONSAI_BENCH_SHAPE="$shape" BONSAI_BENCH_TAGS="$tag" timeout 120 ncu --clock-control none \
    -k regex:matvec6 --launch-skip 6 --launch-count 1 $SECTIONS --print-details all \
    $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name rc=$?"
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc A|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Stall|Executed Instructions  |Grid Size|Block Size" "$OUT/ncu_$name.txt" | grep -v "^ *$" | head -45
done
