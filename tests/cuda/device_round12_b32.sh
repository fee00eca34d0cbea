#!/bin/bash
# Round 12 device run (batched decode at B = 32: the wgmma product's scales one unit ahead), in ONE call: the gate,
# test_cuda (TEST_FILTER), the batched test_engine cases on cuda, memcheck (SAN_FILTER), the kernel table at M = 32
# (v3 and the wgmma kernel in one process), then `bonsai bench --backend cuda -m $P27 -p 0 -n 32 -r 2 --batch 32` per
# CONFIGS entry ("name:ENV=V,ENV=V"; a name starting with "base" runs the BASELINE binary staged as bonsai_r5 by
# stage_devbin.sh), in the order given. Binaries: DEVBIN=.devbin-b32 BUILD=build-cuda BASELINE=<old bonsai>
# tests/cuda/stage_devbin.sh; carry [".devbin-b32"]. $OUT: gate.txt, test_cuda.log, test_engine.log, sanitizer.log,
# bench_kernels.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_MVW=0}"
TEST_FILTER=${TEST_FILTER:-CudaMatvecBatch.Wgmma*} run_test_cuda ${TEST_TIMEOUT:-120}
grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is" "$OUT/test_cuda.log" | head -20
BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter='*BatchDecode*/cuda' \
  > "$OUT/test_engine.log" 2>&1
echo "test_engine rc=$?"; grep -E "^\[  FAILED|^\[  PASSED|Failure" "$OUT/test_engine.log" | head -6
[ -n "${SAN_FILTER-CudaMatvecBatch.WgmmaSmall}" ] && run_sanitizer "${SAN_FILTER-CudaMatvecBatch.WgmmaSmall}" 90
stamp "tests"
BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MIN_M=32 BONSAI_BENCH_MAX_M=32 \
  BONSAI_BENCH_TAGS="${TAGS:-q16 v3 pdl,q16 mvw pdl}" timeout 150 $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' \
  > "$L/bench_kernels.log" 2>&1
echo "kernels rc=$?"; cat "$OUT/bench_kernels.txt"
stamp "kernels"
wait $MP
for cfg in ${CONFIGS:-base:X=1 new:X=1 newall:BONSAI_CUDA_MVW=0 base2:X=1 new2:X=1 newall2:BONSAI_CUDA_MVW=0}; do
  name=${cfg%%:*}; env=${cfg#*:}; bin=$B/bonsai
  case "$name" in base*) bin=$B/bonsai_r5 ;; esac
  echo "== $name ($env, $(basename $bin))" | tee -a "$OUT/bench.txt"
  env ${env//,/ } timeout 150 $bin bench --backend cuda -m $P27 ${BENCH_ARGS:--p 0 -n 32 -r 2 --batch 32} 2>&1 \
    | grep -E "^tg|batch|error" | tee -a "$OUT/bench.txt"
done
stamp "done"
