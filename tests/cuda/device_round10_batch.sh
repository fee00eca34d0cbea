#!/bin/bash
# Round 10 device run (batched-decode wgmma kernel, matvec_wgmma_batch.cu), everything in ONE call: the gate per
# GATE_ENVS entry, test_cuda (TEST_FILTER), the batched test_engine cases on cuda (ENGINE_FILTER), compute-sanitizer
# memcheck (SAN_FILTER), the kernel table for M in [BENCH_MIN_M, BENCH_MAX_M] (TAGS: v3 / matvec_batch / the wgmma
# kernel in the same process), optional ncu (NCU=1: one launch of SHAPE_NCU per NCU_KERNELS regex), then `bonsai bench`
# per CONFIGS entry ("name:ENV=V,ENV=V"; default: the wgmma kernel at M 9..32 (BONSAI_CUDA_MVW=0), on gate+up
# only (4), off (1, the default); round-10 runs B and C had big:BONSAI_CUDA_MVW=3 in its place, run A neither).
# Binaries built here and staged with DEVBIN=.devbin-b32 BUILD=build-cuda-b32 tests/cuda/stage_devbin.sh; run with
# carry [".devbin-b32"]. $OUT: gate.txt, test_cuda.log, test_engine.log, sanitizer.txt, bench_kernels.txt, ncu.txt,
# bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-BONSAI_CUDA_MVW=0 BONSAI_CUDA_MVW=1}"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TEST_FILTER=${TEST_FILTER:-CudaMatvecBatch.Wgmma*} run_test_cuda ${TEST_TIMEOUT:-120}
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|run to run|output" "$OUT/test_cuda.log" | head -30
fi
if [ -n "${ENGINE_FILTER-*BatchDecode*/cuda}" ]; then  # test_engine cases that run on the device (the batched decode on cuda)
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="${ENGINE_FILTER-*BatchDecode*/cuda}" \
    > "$OUT/test_engine.log" 2>&1
  echo "test_engine rc=$?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" "$OUT/test_engine.log" | head -10
fi
if [ -n "${SAN_FILTER-CudaMatvecBatch.WgmmaSmall}" ] && command -v compute-sanitizer > /dev/null; then
  timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool memcheck --print-limit 20 $B/test_cuda \
    --gtest_filter="${SAN_FILTER-CudaMatvecBatch.WgmmaSmall}" > "$OUT/sanitizer.txt" 2>&1
  echo "sanitizer rc=$?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/sanitizer.txt" | head -8
fi
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MIN_M=${BENCH_MIN_M:-8} BONSAI_BENCH_MAX_M=${BENCH_MAX_M:-32} \
    BONSAI_BENCH_SHAPE="${SHAPE:-}" BONSAI_BENCH_TAGS="${TAGS:-q16 v3 pdl,q16 mvb pdl,q16 mvw pdl}" \
    timeout ${KERNEL_TIMEOUT:-150} $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  cat "$OUT/bench_kernels.txt"
fi
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  for k in ${NCU_KERNELS:-mvw_kernel}; do
    tag="q16 v3 pdl"; [ "$k" = mvw_kernel ] && tag="q16 mvw pdl"
    BONSAI_CUDA_BENCH=1 BONSAI_BENCH_SHAPE="${SHAPE_NCU:-gate+up M32}" BONSAI_BENCH_TAGS="$tag" \
      timeout ${NCU_TIMEOUT:-90} ncu --clock-control none -k regex:$k --launch-skip 4 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section MemoryWorkloadAnalysis --section LaunchStats --section InstructionStats -f -o "$L/ncu_$k" \
      $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/ncu_run_$k.txt" 2>&1
    echo "ncu $k rc=$?" | tee -a "$OUT/ncu.txt"
    ncu -i "$L/ncu_$k.ncu-rep" --page details > "$OUT/ncu_$k.txt" 2>&1
    ncu -i "$L/ncu_$k.ncu-rep" --page raw 2>&1 | grep -E "issue_stalled|inst_executed.sum |inst_executed_pipe|gmma|tensor" > "$OUT/ncu_raw_$k.txt"
    grep -E "Duration|Elapsed Cycles|SM Active|Memory Throughput|DRAM Through|L2 Cache Through|Compute \(SM\)|Issue Slots|Eligible Warps|Active Warps Per|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occ|L1/TEX Hit|L2 Hit|Executed Instructions " \
      "$OUT/ncu_$k.txt" | head -40 | tee -a "$OUT/ncu.txt"
    grep -E "stalled" "$OUT/ncu_raw_$k.txt" | awk '{ if ($NF+0 > 0.05) print }' | head -24
  done
fi
if [ "${SKIP_27B:-0}" != 1 ]; then
  wait $MP
  for cfg in ${CONFIGS:-mvw:BONSAI_CUDA_MVW=0 gu:BONSAI_CUDA_MVW=4 off:BONSAI_CUDA_MVW=1}; do
    name=${cfg%%:*}; env=${cfg#*:}
    echo "== $name ($env): bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 32 -r 2 --batch 8,32}" >> "$OUT/bench.txt"
    env ${env//,/ } timeout 150 $B/bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 32 -r 2 --batch 8,32} >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
  done
  grep -vE "^\s*$" "$OUT/bench.txt" | tail -40
fi
