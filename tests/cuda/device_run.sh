#!/bin/bash
# One device run (the lent H200): tests, kernel timings, 27b decode/prefill. Binaries are built on the
# dev machine and carried in .devbin/ with the shared libraries the device image lacks:
#   cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DBONSAI_CUDA=ON
#   cmake --build build-cuda --target test_cuda bonsai
#   tests/cuda/stage_devbin.sh
# Results land in $OUT (test_cuda.log, bench_kernels.txt, bench_model.txt).
set -u
source "$(dirname "$0")/device_env.sh"
device_header "$OUT/nvidia.txt"
start_27b_pack "$OUT/makepack.log"
make_tiny_packs
BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 300 $B/test_cuda --gtest_filter="${TEST_FILTER:--CudaBench.*}" \
  > "$OUT/test_cuda.log" 2>&1
echo "test_cuda rc=$?"
grep -E "^\[  FAILED|^\[  PASSED|tiny|Failure|Expected|Which is|rel_err|<=" "$OUT/test_cuda.log" | head -60
if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT timeout 240 $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' \
    > "$OUT/bench_kernels.log" 2>&1
  echo "kernels rc=$?"
  cat "$OUT/bench_kernels.txt"
fi
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  for r in 2 4; do
    BONSAI_CUDA_BENCH=1 BONSAI_BENCH_SHAPE=ffn_gate timeout 120 ncu --clock-control none -k regex:matvec \
      --launch-skip $((r == 2 ? 2 : 40)) --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section SchedulerStats --section ComputeWorkloadAnalysis \
      $B/test_cuda --gtest_filter='CudaBench.ProbeAndTernaryKernels' > "$OUT/ncu_matvec_r$r.txt" 2>&1
    grep -E "Throughput|Duration|Issue|Stall|Warp Cycles|Eligible|Occupancy|Registers|Executed Ipc|Pipe" "$OUT/ncu_matvec_r$r.txt" | head -40
  done
fi
if [ "${SKIP_27B:-0}" != 1 ]; then
  wait $MP
  ls -la /tmp/p27
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$OUT BONSAI_27B_PACK=/tmp/p27/27b-pq2_0.gguf timeout 400 \
    $B/test_cuda --gtest_filter='CudaBench.Model27b' > "$OUT/bench_model.log" 2>&1
  echo "model rc=$?"
  cat "$OUT/bench_model.txt"
  tail -5 "$OUT/bench_model.log"
fi
