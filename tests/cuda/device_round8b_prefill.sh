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
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -n "$CS" ]; then
    timeout 150 "$CS" --tool memcheck $B/test_cuda --gtest_filter="${SANITIZE_FILTER:-CudaOps.DeltaRuleChunkedMatchesRecurrent}" \
      > "$OUT/sanitizer.log" 2>&1
    echo "sanitizer rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" | head -5
  else
    echo "no compute-sanitizer"
  fi
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
for cfg in ${PROF_CONFIGS:-old:BONSAI_CUDA_DELTA=1 new:X=1}; do
  name=${cfg%%:*}; env=${cfg#*:}
  for p in ${PROF_SIZES:-512 2048}; do
    # -r 1: two prefills (the warm-up and one timed); the report covers both
    env ${env//,/ } BONSAI_CUDA_PROFILE=1 timeout 120 $B/bonsai bench --backend cuda -m $P27 -p $p -n 0 -r 1 \
      > "$L/prof_bench.txt" 2> "$OUT/prof_${name}_$p.txt"
    echo "== profile $name ($env) pp$p rc=$?: two prefills"
    head -14 "$OUT/prof_${name}_$p.txt"
  done
done
stamp "profiles"
for cfg in ${CONFIGS:-new:X=1 old:BONSAI_CUDA_DELTA=1 new:X=1 old:BONSAI_CUDA_DELTA=1}; do
  name=${cfg%%:*}; env=${cfg#*:}
  bin=$B/bonsai; case $name in base*) bin=$B/bonsai_r5 ;; esac
  echo "== $name ($env, $(basename $bin)): bonsai bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2" >> "$OUT/bench.txt"
  env ${env//,/ } timeout 150 $bin bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2 >> "$OUT/bench.txt" 2>&1
  echo "rc=$?" >> "$OUT/bench.txt"
done
stamp "bench"
grep -E "==|^pp|rc=" "$OUT/bench.txt"
