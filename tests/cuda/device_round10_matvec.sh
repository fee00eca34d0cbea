#!/bin/bash
# Round 10 device run (batch-1 matvec v7: the weights through a bulk-copy ring in shared memory, matvec_mma.cu), one
# call with a time guard: the fixture gate with the default and with v7 forced (BONSAI_CUDA_MV6=8), the matvec tests
# (TEST_FILTER), compute-sanitizer memcheck on the small v7 test, the M <= 2 kernel table (TAGS: v3 / v6 / v7 variants
# in the same process), optional Nsight Compute on PROFS ("name:shape:tag;...", skipped when empty), then `bonsai
# bench` tg128 on the 27b-shape pack for each CONFIGS entry ("name:ENV=V,ENV=V", alternated), skipped once the call
# has run BUDGET seconds. Binaries: DEVBIN=.devbin-mv BUILD=build-cuda-mv tests/cuda/stage_devbin.sh; run with carry
# [".devbin-mv"]. $OUT: gate.txt, test_cuda.log, sanitizer.txt, bench_kernels.txt, ncu_<name>.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-BONSAI_CUDA_MV7=0 BONSAI_CUDA_MV7=1}"
echo "t=$(el) s"
if [ -n "${TEST_FILTER-CudaMatvec6.MatchesTheQuantisedReferenceAndV3:CudaMatvec6.V7Small}" ]; then
  TEST_FILTER=${TEST_FILTER-CudaMatvec6.MatchesTheQuantisedReferenceAndV3:CudaMatvec6.V7Small} run_test_cuda ${TEST_TIMEOUT:-120}
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|run to run" "$OUT/test_cuda.log" | head -24
  echo "t=$(el) s"
fi
if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool memcheck --print-limit 20 $B/test_cuda \
    --gtest_filter="${SAN_FILTER:-CudaMatvec6.V7Small}" > "$OUT/sanitizer.txt" 2>&1
  echo "sanitizer rc=$?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/sanitizer.txt" | head -8
  echo "t=$(el) s"
fi
[ -n "${SHAPES:-}" ] && export BONSAI_BENCH_SHAPE="$SHAPES"  # else every M <= 2 shape
BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MAX_M=2 \
  BONSAI_BENCH_TAGS="${TAGS:-q16 pdl,q16 v6 pdl,q16 v7 pdl,q16 v7r1 pdl,q16 v7r2 pdl}" \
  timeout ${KERNEL_TIMEOUT:-150} $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/bench_kernels.log" 2>&1
echo "kernels rc=$? t=$(el) s"
cat "$OUT/bench_kernels.txt"
if [ -n "${PROFS:-}" ] && command -v ncu > /dev/null; then
  IFS=';' read -ra PS <<< "$PROFS"
  for p in "${PS[@]}"; do
    [ $(el) -gt ${NCU_BUDGET:-200} ] && { echo "skip ncu $p: t=$(el) s"; continue; }
    IFS=':' read -r name shape tag <<< "$p"
    BONSAI_CUDA_BENCH=1 BONSAI_BENCH_MAX_M=2 BONSAI_BENCH_SHAPE="$shape" BONSAI_BENCH_TAGS="$tag" timeout 60 ncu \
      --clock-control none -k regex:matvec --launch-skip 6 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats \
      --print-details all $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$OUT/ncu_$name.txt" 2>&1
    echo "== ncu $name rc=$? t=$(el) s"
    grep -E "Duration|Registers Per|Issue Slots Busy|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|DRAM Throughput|L1/TEX Hit|Stall|Executed Instructions  " "$OUT/ncu_$name.txt" | grep -v "^ *$" | head -30
  done
fi
wait $MP
echo "27b pack made: t=$(el) s"
for cfg in ${CONFIGS:-v7:BONSAI_CUDA_MV7=1 r9:BONSAI_CUDA_MV7=0 v7b:BONSAI_CUDA_MV7=1 r9b:BONSAI_CUDA_MV7=0}; do
  [ $(el) -gt ${BUDGET:-230} ] && { echo "skip $cfg: t=$(el) s > BUDGET"; continue; }
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env): bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 128 -r 2}" >> "$OUT/bench.txt"
  env ${env//,/ } timeout 60 $B/bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 128 -r 2} >> "$OUT/bench.txt" 2>&1
  echo "rc=$? t=$(el) s" >> "$OUT/bench.txt"
done
grep -E "==|tg|rc=" "$OUT/bench.txt"
