#!/bin/bash
# Round 12 device run (the chunked delta rule on tensor cores: delta_prep2_kernel / delta_scan2_kernel, 3xTF32;
# BONSAI_CUDA_DELTA_MMA=0: round 8b's FFMA kernels). Binaries built here (DEVBIN=.devbin-dr BUILD=build-cuda-dr
# tests/cuda/stage_devbin.sh), carried in .devbin-dr. In order: the fixture gate per GATE_ENVS entry (default: the
# new path, the FFMA path, the token loop: equal numbers would mean the tiny pack's prefill never reaches the chunked
# form); test_cuda (TEST_FILTER; SKIP_TESTS=1: none); compute-sanitizer memcheck on SANITIZE_FILTER (SANITIZE=0:
# none); the per-kernel profile (BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0) of one 2,048-token prefill per
# PROF_CONFIGS entry; then `bonsai bench -p 512,2048 -n 0 -r 2` per CONFIGS entry in the order given (alternating).
# $OUT: gate.txt, test_cuda.log, sanitizer.log, prof_<name>.txt, bench.txt.
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
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$CS" ]; then
    timeout "${SANITIZE_TIMEOUT:-150}" "$CS" --tool memcheck $B/test_cuda \
      --gtest_filter="${SANITIZE_FILTER:-CudaOps.DeltaRuleChunkedMatchesRecurrent}" > "$OUT/sanitizer.log" 2>&1
    echo "sanitizer rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" | head -5
  else
    echo "no compute-sanitizer"
  fi
  stamp "sanitizer"
fi
wait $MP
stamp "27b pack"
for cfg in ${PROF_CONFIGS:-mma:X=1 ffma:BONSAI_CUDA_DELTA_MMA=0}; do
  name=${cfg%%:*}; env=${cfg#*:}
  env ${env//,/ } BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0 timeout 120 $B/bonsai bench --backend cuda -m $P27 \
    -p 2048 -n 0 -r 1 > "$L/prof_bench.txt" 2> "$OUT/prof_$name.txt"
  echo "== profile $name ($env) pp2048 rc=$?: two prefills"
  grep -E "delta|total" "$OUT/prof_$name.txt" | head -6
done
stamp "profiles"
for cfg in ${CONFIGS:-mma:X=1 ffma:BONSAI_CUDA_DELTA_MMA=0 mma:X=1 ffma:BONSAI_CUDA_DELTA_MMA=0}; do
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env): bonsai bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2" >> "$OUT/bench.txt"
  env ${env//,/ } timeout 150 $B/bonsai bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2 >> "$OUT/bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/bench.txt"
done
stamp "bench"
grep -E "==|^pp|rc=" "$OUT/bench.txt"
