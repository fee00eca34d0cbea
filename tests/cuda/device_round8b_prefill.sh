#!/bin/bash
# Round 8b device run (prefill: the chunked delta rule, delta_chunk.cu). Binaries built here (DEVBIN=.devbin-pf
# BUILD=build-cuda-pf tests/cuda/stage_devbin.sh), carried in .devbin-pf. In order: the fixture gate per
# GATE_ENVS entry; test_cuda (TEST_FILTER); compute-sanitizer memcheck on the new kernel's test (SANITIZE=1);
# the per-kernel profile (BONSAI_CUDA_PROFILE=1, events around every launch) of one prefill of each size in
# PROF_SIZES for each PROF_CONFIGS entry; then `bonsai bench -p 512,2048 -n 0 -r 2` for each CONFIGS entry, in
# the order given (repeat an entry to see the spread). A config name starting with base runs the staged
# BASELINE binary (.devbin-pf/bonsai_r5).
# Env: GATE_ENVS, TEST_FILTER, SKIP_TESTS, SANITIZE, SANITIZE_FILTER, NCU, PROF_SIZES, PROF_CONFIGS, CONFIGS ("name:ENV=V,ENV=V" words).
# $OUT: gate.txt, test_cuda.log, sanitizer.log, prof_<name>_<size>.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
stamp "tiny packs"
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_DELTA=1 BONSAI_CUDA_DELTA=2}" 60
stamp "gates"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test_cuda 200
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|rel_err" "$OUT/test_cuda.log" | head -30
  stamp "test_cuda"
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  run_sanitizer "${SANITIZE_FILTER:-CudaOps.DeltaRuleChunkedMatchesRecurrent}" 150
  stamp "sanitizer"
fi
# NCU="kernel-regex:launches-to-skip:gtest-filter ..." (one launch each, from the op tests: no 27b pack needed)
if [ -n "${NCU:-}" ] && command -v ncu > /dev/null; then
  for spec in $NCU; do
    k=${spec%%:*}; rest=${spec#*:}; skip=${rest%%:*}; filt=${rest#*:}
    timeout 90 ncu --clock-control none -k "regex:$k" --launch-skip $skip --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
      $B/test_cuda --gtest_filter="$filt" > "$OUT/ncu_${k}_$skip.txt" 2>&1
    echo "== ncu $k skip $skip rc=$?"
    grep -E "Duration|Registers Per|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc A|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Shared" "$OUT/ncu_${k}_$skip.txt" | head -16
  done
  stamp "ncu"
fi
wait $MP
stamp "27b pack"
run_prefill_profiles "${PROF_CONFIGS:-old:BONSAI_CUDA_DELTA=1 new:X=1}" "${PROF_SIZES:-512 2048}"
stamp "profiles"
run_prefill_bench "${CONFIGS:-new:X=1 old:BONSAI_CUDA_DELTA=1 new:X=1 old:BONSAI_CUDA_DELTA=1}"
stamp "bench"
