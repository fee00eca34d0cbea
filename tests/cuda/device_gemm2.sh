#!/bin/bash
# One device run for the GEMM v2 (wgmma) work: CUDA tests with the built default (round 5: v2 or v1 per
# product; the ops test also forces v2), the fixture gate and `bonsai bench` on the 27b preset per GEMMS
# entry, the kernel table (BENCH_MIN_M: only shapes with that many tokens), and (SAN=1, SAN_S seconds) one
# compute-sanitizer pass over the ternary ops test. Binaries as for device_run.sh (built here, staged by
# tests/cuda/stage_devbin.sh, carried in .devbin/). Env: SKIP_TESTS, SKIP_KERNELS, SKIP_27B, SAN, GEMMS
# (BONSAI_CUDA_GEMM:BONSAI_CUDA_GEMM2_WGS pairs, default "2:2 1:2"; add "0:2" for the per-product default), TEST_FILTER. $OUT: test_cuda.log,
# gate.txt, bench.txt, bench_kernels.txt, san.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
GEMMS=${GEMMS:-2:2 1:2}
for c in $GEMMS; do
  v=${c%:*}; w=${c#*:}
  BONSAI_CUDA_GEMM=$v BONSAI_CUDA_GEMM2_WGS=$w timeout 120 $B/bonsai gate -m /tmp/tiny7/tiny-pq2_0.gguf --fixture "$FIX" --backend cuda --json \
    > "$L/gate_$v$w.json" 2> "$L/gate_$v$w.err"
  echo "gate gemm $c rc=$? $(tr -d '\n' < "$L/gate_$v$w.json" | grep -oE '"overall"[^}]*}' | head -c 300)" | tee -a "$OUT/gate.txt"
done
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test_cuda 300
  grep -E "^\[  FAILED|^\[  PASSED|^\[tiny|^\[gate|Failure|Expected|Which is|rel_err|<=" "$OUT/test_cuda.log" | head -40
  timeout 200 $B/test_engine --gtest_filter='*BatchDecode*cuda*' > "$L/test_engine.log" 2>&1
  echo "test_engine (BatchDecode cuda) rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$L/test_engine.log"
fi
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_BENCH_MIN_M=${BENCH_MIN_M:-1} timeout 240 $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' \
    > "$L/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  grep -E "probe|M(4|8|32|64|256) " "$OUT/bench_kernels.txt"
fi
if [ "${SKIP_27B:-0}" != 1 ]; then
  wait $MP
  for c in $GEMMS; do
    v=${c%:*}; w=${c#*:}
    for args in "-p 512,2048 -n 32 -r 2" "-p 0 -n 32 -r 2 --batch 8,32"; do
      echo "== BONSAI_CUDA_GEMM=$v BONSAI_CUDA_GEMM2_WGS=$w bonsai bench --backend cuda -m /tmp/p27/27b-pq2_0.gguf $args" >> "$OUT/bench.txt"
      BONSAI_CUDA_GEMM=$v BONSAI_CUDA_GEMM2_WGS=$w timeout 200 $B/bonsai bench --backend cuda -m /tmp/p27/27b-pq2_0.gguf $args >> "$OUT/bench.txt" 2>&1
      echo "rc=$?" >> "$OUT/bench.txt"
    done
  done
  grep -E "==|pp|tg|B=|batch|rc=" "$OUT/bench.txt"
fi
if [ "${SAN:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  timeout ${SAN_S:-120} compute-sanitizer --tool memcheck $B/test_cuda --gtest_filter='CudaOps.TernaryLinear*' > "$OUT/san.txt" 2>&1
  echo "sanitizer rc=$?"; grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUT/san.txt" | head -10
fi
