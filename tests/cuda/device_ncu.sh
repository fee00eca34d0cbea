#!/bin/bash
# Nsight Compute profiles of the ternary kernels (q16 vs q8): the 64-token GEMM (gate+up, M = 64) and the
# M = 1 matvec (ffn_gate), one launch each, from the kernel bench (CudaBench.ProbeAndTernaryKernels with
# BONSAI_BENCH_SHAPE). Variants run in the bench's order: q16, q16 pdl, q8 pdl, ... and every variant
# launches (reps + 2) x copies kernels, so --launch-skip reaches the q8 one. Output: $OUT/ncu_<name>.txt.
set -u
source "$(dirname "$0")/device_env.sh"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
  --section ComputeWorkloadAnalysis --section LaunchStats --section InstructionStats"
prof() {  # name shape kernel-regex skip
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_SHAPE="$2" timeout 150 ncu --clock-control none -k "regex:$3" --launch-skip "$4" \
    --launch-count 1 $SECTIONS $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$OUT/ncu_$1.txt" 2>&1
  echo "== $1 rc=$?"
  grep -E "gemm_kernel<|matvec_kernel<|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc A|Memory Throughput|Compute \(SM\)|Block Limit|Waves Per SM|Grid Size|Stall|L1TEX|Barrier|MIO|Tensor" "$OUT/ncu_$1.txt" | head -40
}
command -v ncu > /dev/null || { echo "no ncu"; exit 1; }
prof gemm_q16_M64 "gate+up M64" gemm_kernel 0
prof gemm_q8_M64 "gate+up M64" gemm_kernel 528
prof matvec_q16_ffn_gate ffn_gate matvec_kernel 0
prof matvec_q8_ffn_gate ffn_gate matvec_kernel 1012
