#!/bin/bash
# Round 12 device run (prefill attention on the tensor cores, attn_prefill_mma.cu; BONSAI_CUDA_ATTN_MMA=0|1|2).
# Binaries built here (DEVBIN=.devbin-att BUILD=build-cuda-att tests/cuda/stage_devbin.sh), carried in .devbin-att.
# In order: the fixture gate per GATE_ENVS entry; test_cuda (TEST_FILTER; SKIP_TESTS=1: none) and the max error lines
# of CudaOps.AttentionPrefillMma; compute-sanitizer memcheck on SANITIZE_FILTER (SANITIZE=0: none); the per-kernel
# profile (BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0) of one pp2048 per PROF_CONFIGS entry; then `bonsai bench -p
# 512,2048 -n 0 -r 2` per CONFIGS entry in the order given (entries name:ENV=V,ENV=V; X=1: the defaults).
# $OUT: gate.txt, test_cuda.log, sanitizer.log, prof_<name>_2048.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
stamp "tiny packs"
run_gates "${GATE_ENVS:-BONSAI_CUDA_ATTN_MMA=1 BONSAI_CUDA_ATTN_MMA=2 BONSAI_CUDA_ATTN_MMA=0}" 60
stamp "gates"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TEST_FILTER=${TEST_FILTER:-CudaOps.AttentionPrefillMma:CudaOps.AttentionDecodeAndPrefill} run_test_cuda "${TEST_TIMEOUT:-150}"
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|rel_err|attn_prefill_mma [0-9]" "$OUT/test_cuda.log" | head -30
  stamp "test_cuda"
  # a failing kernel is not worth timing: STOP_ON_FAIL=0 times it anyway
  grep -q "^\[  FAILED" "$OUT/test_cuda.log" && [ "${STOP_ON_FAIL:-1}" = 1 ] && { cat "$OUT/gate.txt"; exit 1; }
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  run_sanitizer "${SANITIZE_FILTER:-CudaOps.AttentionPrefillMma}" "${SANITIZE_TIMEOUT:-80}" "Failure|attn_prefill_mma [0-9]"
  stamp "sanitizer"
fi
wait $MP
stamp "27b pack"
run_prefill_profiles "${PROF_CONFIGS:-mma1:BONSAI_CUDA_ATTN_MMA=1 mma2:BONSAI_CUDA_ATTN_MMA=2 fp32:BONSAI_CUDA_ATTN_MMA=0}" 2048 \
  "attn|total"
stamp "profiles"
run_prefill_bench "${CONFIGS:-mma1:BONSAI_CUDA_ATTN_MMA=1 fp32:BONSAI_CUDA_ATTN_MMA=0 mma2:BONSAI_CUDA_ATTN_MMA=2 mma1:BONSAI_CUDA_ATTN_MMA=1 fp32:BONSAI_CUDA_ATTN_MMA=0}"
stamp "bench"
cat "$OUT/gate.txt"
