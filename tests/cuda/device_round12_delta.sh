#!/bin/bash
# Round 12 device run (the chunked delta rule on tensor cores: delta_prep2_kernel / delta_scan2_kernel, 3xTF32;
# BONSAI_CUDA_DELTA_MMA=0: round 8b's FFMA kernels). Binaries built here (DEVBIN=.devbin-dr BUILD=build-cuda-dr
# tests/cuda/stage_devbin.sh), carried in .devbin-dr. In order: the fixture gate per GATE_ENVS entry (default: the
# new path, the FFMA path, the token loop: equal numbers would mean the tiny pack's prefill never reaches the chunked
# form); test_cuda (TEST_FILTER; SKIP_TESTS=1: none); compute-sanitizer memcheck on SANITIZE_FILTER (SANITIZE=0:
# none); the per-kernel profile (BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0) of one 2,048-token prefill per
# PROF_CONFIGS entry; then `bonsai bench -p 512,2048 -n 0 -r 2` per CONFIGS entry in the order given (alternating).
# $OUT: gate.txt, test_cuda.log, sanitizer.log, prof_<name>_2048.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
stamp "tiny packs"
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_DELTA_MMA=0 BONSAI_CUDA_DELTA=1}" 60
stamp "gates"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TEST_FILTER=${TEST_FILTER:-CudaOps.DeltaRule*:CudaModel.*} run_test_cuda "${TEST_TIMEOUT:-200}"
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|largest error" "$OUT/test_cuda.log" | head -40
  stamp "test_cuda"
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  run_sanitizer "${SANITIZE_FILTER:-CudaOps.DeltaRuleChunkedMatchesRecurrent}" "${SANITIZE_TIMEOUT:-150}"
  stamp "sanitizer"
fi
wait $MP
stamp "27b pack"
run_prefill_profiles "${PROF_CONFIGS:-mma:X=1 ffma:BONSAI_CUDA_DELTA_MMA=0}" 2048 "delta|total"
stamp "profiles"
run_prefill_bench "${CONFIGS:-mma:X=1 ffma:BONSAI_CUDA_DELTA_MMA=0 mma:X=1 ffma:BONSAI_CUDA_DELTA_MMA=0}"
stamp "bench"
