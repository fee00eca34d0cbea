#!/bin/bash
# Round 18 device run (batched decode's delta rule on delta_rows_kernel; the prefill chunk size). Binaries: DEVBIN=.devbin-me
# BUILD=build STAGE_GZ=1 tests/cuda/stage_devbin.sh; run `bash .devbin-me/device_round18.sh` with carry [".devbin-me"].
# In order: the fixture gate per GATE_ENVS entry, test_cuda (TEST_FILTER), memcheck (SAN_FILTER), then on the 27b pack:
#   AB="name:ENV=V,ENV=V ..."  `bench -p 0 -n 128 -r 2 -d $DEPTHS` per entry (batch-1 decode; DEPTHS default 0)
#   BAB="name:ENV=V,ENV=V ..."  `bench -p 0 -n 32 -r 2 --batch $BATCHES` per entry (repeat entries to bracket drift)
#   PAB="name:ENV=V ..."        `bench -p $PP -n 0 -r $PR` per entry (PP default 512,2048, PR 2; a name prev* runs
#                               bonsai_prev, an earlier build copied beside the binaries)
#   PROF="name:ENV=V ..."       eager per-kernel profile of a B = $PROF_BATCH step (-n 8) per entry, its top lines
#   PROF_PP=N                   eager profile of two N-token prefills, then clocks / power over `-p N -r 5`
#   FINAL=1                     the default binary's `bench -p 512,2048 -n 128 -r 2 -d 0,8192 --json` and the batches
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
device_header "$OUT/gpu.csv"
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1}" 60
stamp "gates"
if [ -n "${TEST_FILTER:-}" ]; then
  run_test_cuda ${TEST_TIMEOUT:-200}
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is" "$OUT/test_cuda.log" | head -20
  stamp "test_cuda"
fi
[ -n "${SAN_FILTER:-}" ] && { run_sanitizer "$SAN_FILTER" ${SAN_TIMEOUT:-90}; stamp "sanitizer"; }
if [ -n "${ENGINE_FILTER:-}" ]; then
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="$ENGINE_FILTER" > "$OUT/test_engine.log" 2>&1
  echo "test_engine rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/test_engine.log" | head -5
fi
wait $MP
stamp "27b pack"
for cfg in ${AB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env)" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 150 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 -d ${DEPTHS:-0} 2>&1 \
    | grep -E "^tg|rror" | tee -a "$OUT/ab.txt"
done
for cfg in ${BAB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  echo "== $name ($env)" | tee -a "$OUT/bab.txt"
  env ${env//,/ } timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch ${BATCHES:-8,16,32} 2>&1 \
    | grep -E "^tg|rror" | tee -a "$OUT/bab.txt"
done
for cfg in ${PAB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  bin=$B/bonsai; case $name in prev*) bin=$B/bonsai_prev ;; esac
  echo "== $name ($env, $(basename $bin))" | tee -a "$OUT/pab.txt"
  env ${env//,/ } timeout 150 $bin bench --backend cuda -m "$P27" -p ${PP:-512,2048} -n 0 -r ${PR:-2} 2>&1 \
    | grep -E "^pp|rror" | tee -a "$OUT/pab.txt"
done
for cfg in ${PROF:-}; do
  name=${cfg%%:*}; env=${cfg#*:}
  env ${env//,/ } BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0 timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 \
    -n 8 -r 1 --batch ${PROF_BATCH:-32} > "$L/prof_bench.txt" 2> "$OUT/prof_$name.txt"
  echo "== profile $name ($env) rc=$?"; head -14 "$OUT/prof_$name.txt"
done
# PROF_PP=N: the eager per-kernel profile of two N-token prefills (the default chunk), then the SM clock and power
# sampled every 100 ms over `bench -p N -n 0 -r 5` (the spread of the 2,048-token chunks: clocks or not?).
if [ -n "${PROF_PP:-}" ]; then
  BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0 timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p $PROF_PP -n 0 -r 1 \
    > "$L/prof_pp.txt" 2> "$OUT/prof_pp$PROF_PP.txt"
  echo "== profile pp$PROF_PP rc=$?"; head -24 "$OUT/prof_pp$PROF_PP.txt"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > "$OUT/clocks.csv" &
  SMI=$!
  timeout 150 $B/bonsai bench --backend cuda -m "$P27" -p $PROF_PP -n 0 -r 5 2>&1 | grep -E "^pp|rror" | tee "$OUT/pp_r5.txt"
  kill $SMI
  awk -F', ' '{gsub(/ MHz/,"",$2); gsub(/ W/,"",$3); if ($3 > 300) {n++; c+=$2; p+=$3; if (min == "" || $2 < min) min = $2; if ($2 > max) max = $2}}
    END {if (n) printf "busy samples %d: SM clock mean %.0f MHz (min %d, max %d), power mean %.0f W\n", n, c / n, min, max, p / n}' \
    "$OUT/clocks.csv"
fi
if [ "${FINAL:-0}" = 1 ]; then
  timeout 200 $B/bonsai bench --backend cuda -m "$P27" -p 512,2048 -n 128 -r 2 -d 0,8192 --json > "$OUT/bench.json" 2> "$OUT/bench.txt"
  echo "bench rc=$?"; tail -6 "$OUT/bench.txt"
  timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch 4,8,16,32 > "$OUT/batch.txt" 2>&1
  echo "batch rc=$?"; tail -4 "$OUT/batch.txt"
fi
stamp "done"
