#!/bin/bash
# Round 8 device run (decode matvec v6, the tensor-core matvec, matvec_mma.cu): gates per GATE_ENVS entry, the
# matvec tests (TEST_FILTER), compute-sanitizer memcheck on the v6 test (SANITIZE=1), the M <= 2 kernel table
# (TAGS), then `bonsai bench` tg128 for each CONFIGS entry ("name:ENV=V,ENV=V"; a name starting with r7 runs
# $B/bonsai_r5, the staged baseline binary). Binaries built here: DEVBIN=.devbin-mv BUILD=build-cuda-mv
# BASELINE=<previous bonsai> tests/cuda/stage_devbin.sh; run with carry [".devbin-mv"].
# ENGINE_FILTER: test_engine cases to run too. $OUT: gate.txt, test_cuda.log, test_engine.log, sanitizer.txt,
# bench_kernels.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_MATVEC=3 BONSAI_CUDA_MATVEC=6}"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TEST_FILTER=${TEST_FILTER:-CudaMatvec6.*:CudaOps.Ternary*:CudaModel.*} run_test_cuda ${TEST_TIMEOUT:-120}
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|vs v3|output" "$OUT/test_cuda.log" | head -30
fi
if [ -n "${ENGINE_FILTER:-}" ]; then  # test_engine cases that run on the device (the batched decode on cuda)
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="$ENGINE_FILTER" > "$OUT/test_engine.log" 2>&1
  echo "test_engine rc=$?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" "$OUT/test_engine.log" | head -10
fi
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool memcheck --print-limit 20 $B/test_cuda \
    --gtest_filter="${SAN_FILTER:-CudaMatvec6.*}" > "$OUT/sanitizer.txt" 2>&1
  echo "sanitizer rc=$?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/sanitizer.txt" | head -8
fi
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MAX_M=${BENCH_MAX_M:-2} \
    BONSAI_BENCH_TAGS="${TAGS:-q16 pdl,q16 v6 pdl,q16 v6c2 pdl,q16 v6c3 pdl,q16 v6c5 pdl,q16 v6c6 pdl,q16 v6c7 pdl}" \
    timeout ${KERNEL_TIMEOUT:-150} $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  cat "$OUT/bench_kernels.txt"
fi
if [ "${SKIP_27B:-0}" != 1 ]; then
  wait $MP
  for cfg in ${CONFIGS:-v6:BONSAI_CUDA_MATVEC=6 v3:BONSAI_CUDA_MATVEC=3 r7:X=1}; do
    name=${cfg%%:*}; env=${cfg#*:}
    bin=$B/bonsai; case $name in r7*) bin=$B/bonsai_r5 ;; esac
    echo "== $name ($env, $(basename $bin)): bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 128 -r 2}" >> "$OUT/bench.txt"
    env ${env//,/ } timeout 150 $bin bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 128 -r 2} >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
  done
  grep -E "==|tg|rc=" "$OUT/bench.txt"
fi
