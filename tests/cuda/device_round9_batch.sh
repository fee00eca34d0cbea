#!/bin/bash
# Round 9 device run (batched-decode kernel, matvec_mma_batch.cu): gates per GATE_ENVS entry, test_cuda (TEST_FILTER),
# the batched test_engine cases on cuda (ENGINE_FILTER), compute-sanitizer memcheck (SANITIZE=1, SAN_FILTER), the
# kernel table for M in [BENCH_MIN_M, BENCH_MAX_M] (TAGS; SHAPE: one shape), then `bonsai bench` per CONFIGS entry
# ("name:ENV=V,ENV=V") with BENCH_ARGS (default: batched decode B = 8 and 32). Binaries built here and staged with
# DEVBIN=.devbin-mv BUILD=build-cuda-mv tests/cuda/stage_devbin.sh; run with carry [".devbin-mv"].
# $OUT: gate.txt, test_cuda.log, test_engine.log, sanitizer.txt, bench_kernels.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_MVB=1}"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TEST_FILTER=${TEST_FILTER:-CudaMatvecBatch.*} run_test_cuda ${TEST_TIMEOUT:-120}
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|run to run|output" "$OUT/test_cuda.log" | head -30
fi
if [ -n "${ENGINE_FILTER:-}" ]; then  # test_engine cases that run on the device (the batched decode on cuda)
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="$ENGINE_FILTER" > "$OUT/test_engine.log" 2>&1
  echo "test_engine rc=$?"
  grep -E "^\[  FAILED|^\[  PASSED|Failure" "$OUT/test_engine.log" | head -10
fi
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool memcheck --print-limit 20 $B/test_cuda \
    --gtest_filter="${SAN_FILTER:-CudaMatvecBatch.*}" > "$OUT/sanitizer.txt" 2>&1
  echo "sanitizer rc=$?"
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/sanitizer.txt" | head -8
fi
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MIN_M=${BENCH_MIN_M:-3} BONSAI_BENCH_MAX_M=${BENCH_MAX_M:-32} \
    BONSAI_BENCH_SHAPE="${SHAPE:-}" BONSAI_BENCH_TAGS="${TAGS:-q16 v3 pdl,q16 mvb pdl}" \
    timeout ${KERNEL_TIMEOUT:-150} $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  cat "$OUT/bench_kernels.txt"
fi
if [ "${SKIP_27B:-0}" != 1 ]; then
  wait $MP
  for cfg in ${CONFIGS:-mvb:X=1 gemm:BONSAI_CUDA_MVB=1}; do
    name=${cfg%%:*}; env=${cfg#*:}
    echo "== $name ($env): bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 32 -r 2 --batch 8,32}" >> "$OUT/bench.txt"
    env ${env//,/ } timeout 150 $B/bonsai bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 32 -r 2 --batch 8,32} >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
  done
  grep -vE "^\s*$" "$OUT/bench.txt" | tail -40
fi
