#!/bin/bash
# Round 6 device run (decode at batch 1): tests, the fixture gate (q16), the M = 1 kernel table (balanced vs
# fixed matvec grid) and `bonsai bench` tg128 on the 27b preset for each A/B switch of the round.
# Binaries built here (BUILD=build-cuda-helper tests/cuda/stage_devbin.sh), carried in .devbin/.
# Env: SKIP_TESTS=1, SKIP_KERNELS=1, SKIP_PP=1, SKIP_BATCH=1 (default 1), CONFIGS (the tg A/B list,
# "name:ENV=V,ENV=V" words; a name starting with r5 runs .devbin/bonsai_r5, the round-5 binary staged as a
# same-run baseline), DEPTH (default 0; e.g. 0,8192), PROMPTS (the -p list of the tg runs, default 0).
# $OUT: test_cuda.log, gate.txt, bench_kernels.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
timeout 120 $B/bonsai gate -m /tmp/tiny7/tiny-pq2_0.gguf --fixture "$FIX" --backend cuda --json > "$L/gate.json" 2> "$L/gate.err"
echo "gate q16 rc=$? $(tr -d '\n' < "$L/gate.json" | grep -oE '"overall"[^}]*}' | head -c 400)" | tee -a "$OUT/gate.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test_cuda 300
  grep -E "^\[  FAILED|^\[  PASSED|^\[tiny|Failure|Expected|Which is" "$OUT/test_cuda.log" | head -40
fi
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MAX_M=1 timeout 200 $B/test_cuda \
    --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$L/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  grep -E "probe|q16" "$OUT/bench_kernels.txt"
fi
wait $MP
for cfg in ${CONFIGS:-default:X=1}; do
  name=${cfg%%:*}; env=${cfg#*:}
  bin=$B/bonsai; case $name in r5*) bin=$B/bonsai_r5 ;; esac
  echo "== $name ($env, $(basename $bin)): bonsai bench --backend cuda -m $P27 -p ${PROMPTS:-0} -n 128 -r 2 -d ${DEPTH:-0}" >> "$OUT/bench.txt"
  env ${env//,/ } timeout 300 $bin bench --backend cuda -m $P27 -p ${PROMPTS:-0} -n 128 -r 2 -d ${DEPTH:-0} >> "$OUT/bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/bench.txt"
  if [ "${SKIP_BATCH:-1}" != 1 ]; then
    echo "== $name ($env, $(basename $bin)): bonsai bench --backend cuda -m $P27 -p 0 -n 32 -r 2 --batch 8,32" >> "$OUT/bench.txt"
    env ${env//,/ } timeout 200 $bin bench --backend cuda -m $P27 -p 0 -n 32 -r 2 --batch 8,32 >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
  fi
done
if [ "${SKIP_PP:-0}" != 1 ]; then
  echo "== default: bonsai bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2" >> "$OUT/bench.txt"
  timeout 200 $B/bonsai bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2 >> "$OUT/bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/bench.txt"
fi
grep -E "==|pp|tg|B=|batch|rc=|probe" "$OUT/bench.txt"
