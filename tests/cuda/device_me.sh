#!/bin/bash
# Session check run of the coordinator's changes: delta-rule tests, gate, batched bench, and the launch order
# of one decode step (BONSAI_CUDA_PROFILE=2). Binaries: DEVBIN=.devbin-me BUILD=build-cuda tests/cuda/stage_devbin.sh.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
timeout 60 $B/bonsai gate -m /tmp/tiny7/tiny-pq2_0.gguf --fixture "$FIX" --backend cuda > "$OUT/gate.txt" 2>&1
echo "gate rc=$?"; tail -2 "$OUT/gate.txt"
TEST_FILTER=${TEST_FILTER:-CudaOps.DeltaRule*:CudaModel.*} run_test_cuda 150
grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|launches" "$OUT/test_cuda.log" | head -20
BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="${ENGINE_FILTER:-Batch*}" > "$OUT/test_engine.log" 2>&1
echo "test_engine rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/test_engine.log" | head -5
wait $MP
BONSAI_CUDA_PROFILE=2 BONSAI_CUDA_GRAPHS=0 timeout 100 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 4 -r 1 > "$OUT/order_B1.txt" 2>&1
[ "${ORDER_B32:-0}" = 1 ] && BONSAI_CUDA_PROFILE=2 BONSAI_CUDA_GRAPHS=0 timeout 100 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 4 -r 1 --batch 32 > "$OUT/order_B32.txt" 2>&1
for cfg in ${CONFIGS:-default:X=1}; do
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name"
  env ${env//,/ } timeout 150 $B/bonsai bench --backend cuda -m "$P27" ${BENCH_ARGS:--p 512 -n 128 -r 2} 2>&1 | grep -E "^(pp|tg)"
  env ${env//,/ } timeout 150 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch 8,32 2>&1 | grep -E "^(pp|tg)"
done
