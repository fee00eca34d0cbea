#!/bin/bash
# Round 7 device run (prefill GEMM): correctness of the GEMM v3 (warp-specialised wgmma) first (ternary ops and
# tiny-model tests, the fixture gate per GATE_ENVS entry), then the kernel table
# (v1 / v2 / v3 at M >= 32), `bonsai bench` pp512/pp2048 and batched B = 8/32 for each CONFIGS entry (a name
# starting with r6 runs .devbin/bonsai_r5, the staged baseline binary of the previous round; prev*:
# .devbin/bonsai_prev, an earlier build of this round copied there by hand), and (NCU=1)
# ncu on gate+up M256 for v2 and v3. Binaries built here (BUILD=build-cuda-helper BASELINE=<previous bonsai>
# tests/cuda/stage_devbin.sh), carried in .devbin/.
# Env: GATE_ENVS ("ENV=V,ENV=V" words, one gate each), BENCH_MIN_M, SKIP_TESTS, SKIP_KERNELS, SKIP_27B, NCU, CONFIGS ("name:ENV=V,ENV=V" words), TAGS (kernel variants),
# BATCH_ARGS (the batched bench's arguments; empty: none), TEST_FILTER, NCU_KERNELS ("kernel:variant tag;..."), NCU_SHAPE. $OUT: test_cuda.log, gate.txt, bench_kernels.txt, bench.txt, ncu_*.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_GEMM=3}"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test_cuda 150
  grep -E "^\[  FAILED|^\[  PASSED|^\[tiny|Failure|Expected|Which is" "$OUT/test_cuda.log" | head -30
fi
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MIN_M=${BENCH_MIN_M:-32} BONSAI_BENCH_TAGS="${TAGS:-q16 pdl,q16 v2 pdl,q16 v3 pdl}" \
    timeout 150 $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  grep -E "probe|M(4|8|32|64|256) " "$OUT/bench_kernels.txt"
fi
if [ "${SKIP_27B:-0}" != 1 ]; then
  wait $MP
  for cfg in ${CONFIGS:-default:X=1 v3:BONSAI_CUDA_GEMM=3 r6:X=1}; do
    name=${cfg%%:*}; env=${cfg#*:}
    bin=$B/bonsai; case $name in r6*) bin=$B/bonsai_r5 ;; prev*) bin=$B/bonsai_prev ;; esac
    for args in "-p 512,2048 -n 0 -r 2" ${BATCH_ARGS-"-p 0 -n 32 -r 2 --batch 8,32"}; do
      echo "== $name ($env, $(basename $bin)): bonsai bench --backend cuda -m $P27 $args" >> "$OUT/bench.txt"
      env ${env//,/ } timeout 150 $bin bench --backend cuda -m $P27 $args >> "$OUT/bench.txt" 2>&1
      echo "rc=$?" >> "$OUT/bench.txt"
    done
  done
  grep -E "==|pp|B=|batch|rc=" "$OUT/bench.txt"
fi
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  IFS=';' read -ra KS <<< "${NCU_KERNELS:-gemm2_kernel:q16 v2 pdl;gemm3_kernel:q16 v3 pdl}"
  for k in "${KS[@]}"; do
    BONSAI_CUDA_BENCH=1 BONSAI_BENCH_SHAPE="${NCU_SHAPE:-gate+up M256}" BONSAI_BENCH_TAGS="${k#*:}" timeout 90 ncu --clock-control none \
      -k "regex:${k%%:*}" --launch-skip 4 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section Occupancy $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' \
      > "$OUT/ncu_${k%%:*}.txt" 2>&1
    echo "== ncu ${k%%:*} rc=$?"
    grep -E "Duration|Registers Per|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc A|Memory Throughput|Compute \(SM\)|Stall" "$OUT/ncu_${k%%:*}.txt" | head -24
  done
fi
