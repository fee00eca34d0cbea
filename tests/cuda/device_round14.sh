#!/bin/bash
# Round 14 device run (batch-1 decode: matvec v7's per-stage overhead and its mma chains). Binaries: DEVBIN=.devbin-me
# BUILD=build-cuda BASELINE=<the previous round's bonsai> tests/cuda/stage_devbin.sh, plus that round's test_cuda copied
# beside them as test_cuda_base (optional); run `bash .devbin-me/device_round14.sh` with carry [".devbin-me"]. In order:
# test_cuda (TEST_FILTER), memcheck (SAN_FILTER), the fixture gate per GATE_ENVS entry, the kernel table
# (BENCH_SHAPES x BENCH_TAGS, then BASE_TAGS on test_cuda_base), then `bonsai bench --backend cuda -m $P27 -p 0 -n 128
# -r 2 -d $DEPTHS` per AB entry ("name:ENV=V,ENV=V"; X=1: the defaults; a name starting with base runs the BASELINE
# binary, with prev an intermediate build's bonsai copied beside it as bonsai_prev, its test_cuda as test_cuda_prev),
# in the order given: repeat an entry to bracket the machine's drift. Round 15: TEST2="ENV=V,ENV=V|gtest filter" runs
# test_cuda once more under that environment (into $OUT/test_cuda2.log).
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
if [ -n "${TEST_FILTER:-}" ]; then
  stamp "tests"
  run_test_cuda ${TEST_TIMEOUT:-200}
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|tests ran" "$OUT/test_cuda.log" | head -50
fi
if [ -n "${TEST2:-}" ]; then
  stamp "tests under ${TEST2%%|*}"
  env ${TEST2%%|*} BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf BONSAI_TINY7_PACK=/tmp/tiny7/tiny-pq2_0.gguf \
    BONSAI_GATE_FIXTURE="$FIX" timeout ${TEST2_TIMEOUT:-120} $B/test_cuda --gtest_filter="${TEST2#*|}" > "$OUT/test_cuda2.log" 2>&1
  echo "test_cuda (2) rc=$?"
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|tests ran" "$OUT/test_cuda2.log" | head -30
fi
[ -n "${SAN_FILTER:-}" ] && { stamp "memcheck"; run_sanitizer "$SAN_FILTER" ${SAN_TIMEOUT:-150}; }
stamp "gates"
run_gates "${GATE_ENVS:-X=1}" 60
kernel_table() {  # $1 binary, $2 tags, $3 label
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$L BONSAI_BENCH_SHAPE="$BENCH_SHAPES" BONSAI_BENCH_TAGS="$2" \
    timeout 200 "$1" --gtest_filter=CudaBench.ProbeAndTernaryKernels > "$L/bench_kernels_$3.log" 2>&1
  echo "kernel bench $3 rc=$?"; cp "$L/bench_kernels.txt" "$OUT/bench_kernels_$3.txt" 2>/dev/null
  cat "$L/bench_kernels.txt" 2>/dev/null; rm -f "$L/bench_kernels.txt"
}
if [ -n "${BENCH_SHAPES:-}" ]; then
  stamp "kernel table"
  kernel_table $B/test_cuda "${BENCH_TAGS:-q16 v7 pdl}" new
  [ -x $B/test_cuda_base ] && kernel_table $B/test_cuda_base "${BASE_TAGS:-q16 v7 pdl}" base
  [ -x $B/test_cuda_prev ] && kernel_table $B/test_cuda_prev "${BASE_TAGS:-q16 v7 pdl}" prev
fi
wait $MP
stamp "27b pack"
for cfg in ${AB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  bin=$B/bonsai; case $name in base*) bin=$B/bonsai_r5 ;; prev*) bin=$B/bonsai_prev ;; esac
  echo "== $name ($env, $(basename $bin))" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 150 $bin bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 -d ${DEPTHS:-0} 2>&1 \
    | grep -E "^tg|error|rror" | tee -a "$OUT/ab.txt"
done
[ -n "${PAB:-}" ] && { stamp "prefill"; run_prefill_bench "$PAB"; }
[ -n "${BAB:-}" ] && { stamp "batch"; run_batch_bench "$BAB"; }
stamp "done"
