#!/bin/bash
# One device run for the activation-precision work (q16 default vs q8 vs exact): CUDA tests, the fixture
# gate per mode, `bonsai bench` on the 27b preset per mode, kernel timings, and (MODEL27B=1) the
# CudaBench.Model27b harness. Binaries as for device_run.sh (built on the dev machine, staged by
# tests/cuda/stage_devbin.sh, carried in .devbin/).
# Env: SKIP_TESTS=1, SKIP_KERNELS=1, SKIP_27B=1, MODEL27B=1, TEST_FILTER (test_cuda), MODES (default "q16 q8").
# $OUT gets at most 5 files (the device tool returns 8): test_cuda.log, gate.txt, bench.txt,
# bench_kernels.txt, bench_model.txt; everything else stays in /tmp/logs.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
for mode in ${GATE_MODES:-exact q8 q16}; do
  case $mode in exact) env="BONSAI_CUDA_EXACT=1" ;; *) env="BONSAI_CUDA_ACT=$mode" ;; esac
  env $env timeout 120 $B/bonsai gate -m /tmp/tiny7/tiny-pq2_0.gguf --fixture "$FIX" --backend cuda --json \
    > "$L/gate_$mode.json" 2> "$L/gate_$mode.err"
  echo "gate $mode rc=$? $(tr -d '\n' < "$L/gate_$mode.json" | grep -oE '"overall"[^}]*}' | head -c 400)" | tee -a "$OUT/gate.txt"
done
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test_cuda 300
  grep -E "^\[  FAILED|^\[  PASSED|^\[tiny|^\[gate|Failure|Expected|Which is|rel_err|<=" "$OUT/test_cuda.log" | head -60
  timeout 200 $B/test_engine --gtest_filter='*BatchDecode*cuda*' > "$L/test_engine.log" 2>&1
  echo "test_engine (BatchDecode cuda) rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$L/test_engine.log"
fi
if [ "${SKIP_27B:-0}" != 1 ]; then
  wait $MP
  for mode in ${MODES:-q16 q8}; do
    echo "== $mode: bonsai bench --backend cuda -m /tmp/p27/27b-pq2_0.gguf -p 512,2048 -n 128 -r 3" >> "$OUT/bench.txt"
    BONSAI_CUDA_ACT=$mode timeout 200 $B/bonsai bench --backend cuda -m /tmp/p27/27b-pq2_0.gguf -p 512,2048 -n 128 -r 3 \
      >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
    echo "== $mode: bonsai bench --backend cuda -m /tmp/p27/27b-pq2_0.gguf -p 0 -n 32 -r 2 --batch 8,32" >> "$OUT/bench.txt"
    BONSAI_CUDA_ACT=$mode timeout 200 $B/bonsai bench --backend cuda -m /tmp/p27/27b-pq2_0.gguf -p 0 -n 32 -r 2 --batch 8,32 \
      >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
  done
  grep -E "==|pp|tg|rc=" "$OUT/bench.txt"
fi
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT timeout 240 $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' \
    > "$L/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  cat "$OUT/bench_kernels.txt"
fi
if [ "${MODEL27B:-0}" = 1 ] && [ "${SKIP_27B:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_27B_PACK=/tmp/p27/27b-pq2_0.gguf timeout 300 \
    $B/test_cuda --gtest_filter='CudaBench.Model27b' > "$L/bench_model.log" 2>&1
  echo "model rc=$?"
  grep -vE "^ +[a-z_]+.*[0-9]+ x" "$OUT/bench_model.txt" | head -40
fi
