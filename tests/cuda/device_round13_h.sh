#!/bin/bash
# Round 13: GEMM v4 (fp16 activations, gemm_f16.cu). Tests (TEST_FILTER, default CudaOps.GemmF16*), memcheck of
# SAN_FILTER, the fixture gate per GATE_ENVS, the kernel table (q16 v3 against q16 h on BENCH_SHAPES), then
# `bonsai bench` per PAB entry (prefill: -p 512,2048 -n 0 -r 2) and per BAB entry (batched: -p 0 -n 32 -r 2 --batch 32),
# alternating in the order given ("name:ENV=V,ENV=V"; X=1: the defaults).
set -u
source "$(dirname "$0")/device_env.sh"
device_header
make_tiny_packs
start_27b_pack
stamp "tests"
rc_line=$(TEST_FILTER=${TEST_FILTER:-CudaOps.GemmF16*} run_test_cuda "${TEST_TIMEOUT:-200}"); echo "$rc_line"
grep -E "^\[  (PASSED|FAILED) |^\[       OK|^\[  FAILED|tests ran|gemm f16\]|Failure|Expected|Which is|actual" "$OUT/test_cuda.log" | head -60
[ -n "${SAN_FILTER:-}" ] && { stamp "memcheck"; run_sanitizer "$SAN_FILTER" "${SAN_TIMEOUT:-200}"; }
[ "$rc_line" != "test_cuda rc=0" ] && [ "${STOP_ON_FAIL:-1}" = 1 ] && { echo "tests failed: stop"; exit 1; }
stamp "gates"
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_GEMMH=3}" 60
wait $MP
if [ -n "${BENCH_SHAPES:-}" ]; then
  stamp "kernel table"
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_SHAPE="$BENCH_SHAPES" BONSAI_BENCH_TAGS="${BENCH_TAGS:-q16 v3 pdl,q16 h pdl}" \
    timeout 240 $B/test_cuda --gtest_filter=CudaBench.ProbeAndTernaryKernels > "$L/bench_kernels.log" 2>&1
  echo "kernel bench rc=$?"; cat "$OUT/bench_kernels.txt" 2>/dev/null | tail -40
fi
stamp "whole model"
[ -n "${PAB:-}" ] && run_prefill_bench "$PAB"
run_batch_bench "${BAB:-}"
stamp done
