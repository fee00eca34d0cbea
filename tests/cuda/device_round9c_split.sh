#!/bin/bash
# Round 9c device run (v6 split-K for ffn_down, matvec_mma.cu), one call, with a time guard: a gate with split-K
# forced on every single-output v6 product of the tiny pack, the split-K tests (TEST_FILTER), compute-sanitizer
# memcheck on the small ones, the kernel table for ffn_down M1 / down M2 (v3 vs v6 vs v6 split), then `bonsai bench`
# tg128 on the 27b-shape pack for each CONFIGS entry ("name:ENV=V,ENV=V", alternated on / off), skipped once the
# call has run BUDGET seconds. Binaries: DEVBIN=.devbin-mv BUILD=<build dir> tests/cuda/stage_devbin.sh; run with
# carry [".devbin-mv"]. $OUT: gate.txt, test_cuda.log, sanitizer.txt, bench_kernels.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
device_header
start_27b_pack
make_tiny_packs
env BONSAI_CUDA_MV6_SPLIT=2 BONSAI_CUDA_MV6_SPLIT_ANY=1 timeout 40 $B/bonsai gate -m /tmp/tiny7/tiny-pq2_0.gguf \
  --fixture "$FIX" --backend cuda --json > "$L/gate.json" 2> "$L/gate.err"
echo "gate split2 any rc=$? $(tr -d '\n' < "$L/gate.json" | grep -oE '"overall"[^}]*}' | head -c 300)" | tee -a "$OUT/gate.txt"
echo "t=$(el) s"
TEST_FILTER=${TEST_FILTER:-CudaMatvec6.Split*} run_test_cuda ${TEST_TIMEOUT:-70}
grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|run to run" "$OUT/test_cuda.log" | head -20
echo "t=$(el) s"
if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout ${SAN_TIMEOUT:-40} compute-sanitizer --tool memcheck --print-limit 20 $B/test_cuda \
    --gtest_filter="${SAN_FILTER:-CudaMatvec6.SplitKSmall}" > "$OUT/sanitizer.txt" 2>&1
  echo "sanitizer rc=$?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/sanitizer.txt" | head -8
  echo "t=$(el) s"
fi
BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_SHAPE="${SHAPES:-ffn_down,down M2}" \
  BONSAI_BENCH_TAGS="${TAGS:-q16 pdl,q16 v6c7 pdl,q16 v6s2 pdl,q16 v6s4 pdl,q16 v6s2z pdl,q16 v6c5s2 pdl,q16 v6c5s4 pdl}" \
  timeout ${KERNEL_TIMEOUT:-60} $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/bench_kernels.log" 2>&1
echo "kernels rc=$? t=$(el) s"
wait $MP
echo "27b pack made: t=$(el) s"
for cfg in ${CONFIGS:-s2:BONSAI_CUDA_MV6_SPLIT=2 off:BONSAI_CUDA_MV6_SPLIT=0 s4:BONSAI_CUDA_MV6_SPLIT=4 off2:BONSAI_CUDA_MV6_SPLIT=0}; do
  [ $(el) -gt ${BUDGET:-110} ] && { echo "skip $cfg: t=$(el) s > BUDGET"; continue; }
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env): bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 128 -r 2}" >> "$OUT/bench.txt"
  env ${env//,/ } timeout 40 $B/bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 128 -r 2} >> "$OUT/bench.txt" 2>&1
  echo "rc=$? t=$(el) s" >> "$OUT/bench.txt"
done
cat "$OUT/bench_kernels.txt"
grep -E "==|tg|rc=" "$OUT/bench.txt"
