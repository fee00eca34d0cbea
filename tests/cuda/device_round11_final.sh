#!/bin/bash
# Round 11's end-of-session run: device_final.sh's checks and numbers plus a prefill A/B. Binaries: DEVBIN=.devbin-me
# BUILD=build-cuda tests/cuda/stage_devbin.sh; run `bash .devbin-me/device_round11_final.sh` with carry [".devbin-me"].
# GATE_ENVS: the fixture gate per entry; TEST_FILTER / SAN_FILTER / ENGINE_FILTER as device_final.sh; then `bonsai
# bench` pp512, pp2048, tg128 at depth 0 and 8192 (defaults), batched B = 4 / 8 / 32, and `bonsai bench -p 512,2048 -n 0
# -r 2` per PAB entry ("name:ENV=V,ENV=V"), B = 32 per BAB entry. $OUT: gate.txt, test_cuda.log, sanitizer.log,
# test_engine.log, bench.json, bench.txt, batch.txt, pab.txt, bab.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1}" 60
stamp "gates"
run_test_cuda ${TEST_TIMEOUT:-300}
grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is" "$OUT/test_cuda.log" | head -20
stamp "test_cuda"
if [ -n "${SAN_FILTER:-}" ]; then
  run_sanitizer "$SAN_FILTER" ${SAN_TIMEOUT:-90}
  stamp "sanitizer"
fi
if [ -n "${ENGINE_FILTER:-}" ]; then
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="$ENGINE_FILTER" > "$OUT/test_engine.log" 2>&1
  echo "test_engine rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/test_engine.log" | head -5
fi
wait $MP
stamp "27b pack"
timeout 200 $B/bonsai bench --backend cuda -m "$P27" -p 512,2048 -n 128 -r 2 -d 0,8192 --json > "$OUT/bench.json" 2> "$OUT/bench.txt"
echo "bench rc=$?"; tail -6 "$OUT/bench.txt"
timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch ${BATCHES:-4,8,32} > "$OUT/batch.txt" 2>&1
echo "batch rc=$?"; tail -4 "$OUT/batch.txt"
stamp "numbers"
for cfg in ${PAB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env)" | tee -a "$OUT/pab.txt"
  env ${env//,/ } timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 512,2048 -n 0 -r 2 2>&1 | grep -E "^pp|rror" | tee -a "$OUT/pab.txt"
done
# BAB: the same for batched decode at B = 32 (`-p 0 -n 32 -r 2 --batch 32`).
run_batch_bench "${BAB:-}"
stamp "done"
