#!/bin/bash
# Round 11 device run (batch-1 decode: the site as matvec v7's prologue). Binaries: DEVBIN=.devbin-me BUILD=build-cuda
# tests/cuda/stage_devbin.sh; run `bash .devbin-me/device_round11_decode.sh` with carry [".devbin-me"]. In order: the
# fixture gate per GATE_ENVS entry; test_cuda (TEST_FILTER); compute-sanitizer memcheck (SAN_FILTER); then
# `bonsai bench --backend cuda -m $P27 -p 0 -n 128 -r 2 -d $DEPTHS` per AB entry ("name:ENV=V,ENV=V"; X=1: the defaults),
# in the order given: repeat an entry to bracket the machine's drift.
# PROF: per-kernel profiles (below). $OUT: gate.txt, test_cuda.log, sanitizer.log, ab.txt, prof_<name>.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1}" 60
stamp "gates"
if [ -n "${TEST_FILTER:-}" ]; then
  run_test_cuda ${TEST_TIMEOUT:-200}
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|^\[tiny" "$OUT/test_cuda.log" | head -40
  stamp "test_cuda"
fi
if [ -n "${SAN_FILTER:-}" ]; then
  run_sanitizer "$SAN_FILTER" ${SAN_TIMEOUT:-150}
  stamp "sanitizer"
fi
wait $MP
stamp "27b pack"
for cfg in ${AB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env)" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 150 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 -d ${DEPTHS:-0} 2>&1 \
    | grep -E "^tg|error|rror" | tee -a "$OUT/ab.txt"
done
# PROF="name:ENV=V,... ...": the per-kernel profile of 16 decode tokens (eager launches, events around each) per entry;
# PROF_BATCH=B: of B sequences stepped together instead of one.
for cfg in ${PROF:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  env ${env//,/ } BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0 timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 16 \
    -r 1 ${PROF_BATCH:+--batch $PROF_BATCH} > "$L/prof_bench.txt" 2> "$OUT/prof_$name.txt"
  echo "== profile $name ($env) rc=$?"; head -12 "$OUT/prof_$name.txt"
done
stamp "done"
