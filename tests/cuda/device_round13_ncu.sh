#!/bin/bash
# Round 13, call 1: (1) the test_cuda tests round 12's final call did not reach (TEST_FILTER), (2) ncu with source
# counters (--set full) on one launch (NCU_KERNEL, default GEMM v3; NCU_TAGS the kernel bench variant) per NCU entry "name:shape" of the kernel bench (q16 v3), exported as the
# per-SASS-instruction stall table $OUT/sass_<name>.csv and the details page $OUT/ncu_<name>.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
make_tiny_packs
if [ -n "${TEST_FILTER:-}" ]; then
  stamp "tests"
  run_test_cuda "${TEST_TIMEOUT:-200}"
  grep -E "^\[  (PASSED|FAILED) |^\[       OK|^\[  FAILED|tests ran" "$OUT/test_cuda.log" | tail -30
fi
for spec in ${NCU:-}; do
  IFS=: read -r name shape <<< "$spec"
  stamp "ncu $name ($shape)"
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_SHAPE="${shape//_/ }" BONSAI_BENCH_TAGS="${NCU_TAGS:-q16 v3 pdl}" timeout 240 ncu --set full \
    --import-source no --clock-control none -k "regex:${NCU_KERNEL:-gemm3_kernel}" --launch-skip 3 --launch-count 1 -f -o "$L/$name" \
    $B/test_cuda --gtest_filter=CudaBench.ProbeAndTernaryKernels > "$L/ncu_$name.log" 2>&1
  echo "ncu rc=$?"; tail -3 "$L/ncu_$name.log"
  ncu -i "$L/$name.ncu-rep" --page details --print-details all > "$OUT/ncu_$name.txt" 2>&1
  ncu -i "$L/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$name.csv" 2>&1 ||
    ncu -i "$L/$name.ncu-rep" --page source --csv > "$OUT/sass_$name.csv" 2>&1
  ls -la "$OUT/sass_$name.csv"; grep -E "Duration|Registers Per|Warp Cycles Per Issued|Issued Warp|No Eligible" "$OUT/ncu_$name.txt" | head -8
done
stamp done
