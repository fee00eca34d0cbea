#!/bin/bash
# The end-of-session check of a committed build on the H200: the fixture gate (default options), the model /
# sampling / matvec tests, then the README's numbers: `bonsai bench --backend cuda` pp512, pp2048, tg128 at
# depth 0 and 8192, and batched greedy decode at B = 8 and 32. Binaries: DEVBIN=.devbin-me BUILD=build-cuda
# tests/cuda/stage_devbin.sh; run `bash .devbin-me/device_final.sh` with carry [".devbin-me"].
# SAN_FILTER: test_cuda cases to run under compute-sanitizer memcheck too; ENGINE_FILTER: test_engine cases;
# BATCHES: the --batch list (default 8,32); AB: switch A/B configs (at the end).
# $OUT: gate.txt, test_cuda.log, sanitizer.txt, test_engine.log, bench.json, bench.txt, batch.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
timeout 60 $B/bonsai gate -m /tmp/tiny7/tiny-pq2_0.gguf --fixture "$FIX" --backend cuda > "$OUT/gate.txt" 2>&1
echo "gate rc=$?"; tail -4 "$OUT/gate.txt"
TEST_FILTER=${TEST_FILTER:-CudaModel.*:CudaSampling.*:CudaMatvec6.*} run_test_cuda ${TEST_TIMEOUT:-150}
grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is" "$OUT/test_cuda.log" | head -20
if [ -n "${SAN_FILTER:-}" ] && command -v compute-sanitizer > /dev/null; then  # memcheck on the named tests
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool memcheck \
    --print-limit 20 $B/test_cuda --gtest_filter="$SAN_FILTER" > "$OUT/sanitizer.txt" 2>&1
  echo "sanitizer rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.txt" | head -6
fi
if [ -n "${ENGINE_FILTER:-}" ]; then  # test_engine cases that run on cuda (batched decode)
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="$ENGINE_FILTER" > "$OUT/test_engine.log" 2>&1
  echo "test_engine rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/test_engine.log" | head -5
fi
wait $MP
timeout 200 $B/bonsai bench --backend cuda -m "$P27" -p 512,2048 -n 128 -r 2 -d 0,8192 --json > "$OUT/bench.json" 2> "$OUT/bench.txt"
echo "bench rc=$?"; tail -8 "$OUT/bench.txt"
timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch ${BATCHES:-8,32} > "$OUT/batch.txt" 2>&1
echo "batch rc=$?"; tail -4 "$OUT/batch.txt"
# AB="name:ENV=V,ENV=V ...": after the numbers above, `bonsai bench -p 0 -n 128 -r 2 -d 0,8192` per entry (switch
# A/B in the same binary and call; a default entry X=1 first and last brackets the machine's drift).
for cfg in ${AB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env)" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 -d 0,8192 2>&1 | grep -E "^tg" | tee -a "$OUT/ab.txt"
done
