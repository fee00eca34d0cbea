#!/bin/bash
# Round 9 device run (decode sites and norms): Options::norm_cluster (BONSAI_CUDA_NORM_CLUSTER, the add_rmsnorm /
# rmsnorm fused into the site as one thread-block cluster per row) and Options::site_xpose (BONSAI_CUDA_SITE_XPOSE,
# the FWHT strides >= 32 as shuffles after one transpose). Binaries built here (DEVBIN=.devbin-site
# BUILD=build-cuda-pf tests/cuda/stage_devbin.sh, staged into a folder of its own right after a build with nothing
# left to do: the build dir is shared), carried in .devbin-site. In order: the fixture gate per GATE_ENVS
# entry; test_cuda (TEST_FILTER); then per ROUNDS, each CONFIGS entry's `bonsai bench -p 0 -n 128 -r 2` (batch 1) and
# `-p 0 -n 32 -r 2 --batch 8,32` (same binary, configs alternated); then the eager per-kernel profile (events around
# every launch) of PROF_CONFIGS at batch 1 and 32.
# Env: GATE_ENVS, TEST_FILTER, SKIP_TESTS, CONFIGS ("name:ENV=V,ENV=V" words), ROUNDS, BATCH_BENCH (0: batch 1 only),
# PROF_CONFIGS (set empty: no profiles), PROF_BATCHES.
# $OUT: gate.txt, test_cuda.log, bench.txt, prof_<name>_B<b>.txt. Each bench line shows the activation form (q16 is
# the default; a "q8" there from a binary whose objects disagree on CudaBackend::Options, see round 9 notes).
set -u
source "$(dirname "$0")/device_env.sh"
device_header
env | grep "^BONSAI" || true
start_27b_pack
make_tiny_packs
stamp "tiny packs"
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_NORM_CLUSTER=0,BONSAI_CUDA_SITE_XPOSE=0}" 60
stamp "gates"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test_cuda 150
  grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|Failure|Expected|Which is|rel_err" "$OUT/test_cuda.log" | head -30
  stamp "test_cuda"
fi
wait $MP
stamp "27b pack"
for round in $(seq ${ROUNDS:-2}); do
  for cfg in ${CONFIGS:-off:BONSAI_CUDA_NORM_CLUSTER=0,BONSAI_CUDA_SITE_XPOSE=0 nc1:BONSAI_CUDA_NORM_CLUSTER=1 x1:BONSAI_CUDA_SITE_XPOSE=1 def:X=1}; do
    name=${cfg%%:*}; env=${cfg#*:}
    echo "== $name round $round ($env)" >> "$OUT/bench.txt"
    env ${env//,/ } timeout 60 $B/bonsai bench --backend cuda -m $P27 -p 0 -n 128 -r 2 >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
    [ "${BATCH_BENCH:-1}" = 1 ] || continue
    env ${env//,/ } timeout 60 $B/bonsai bench --backend cuda -m $P27 -p 0 -n 32 -r 2 --batch 8,32 >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
  done
  stamp "bench round $round"
done
for cfg in ${PROF_CONFIGS-off:BONSAI_CUDA_NORM_CLUSTER=0,BONSAI_CUDA_SITE_XPOSE=0 def:X=1}; do
  name=${cfg%%:*}; env=${cfg#*:}
  for b in ${PROF_BATCHES:-1 32}; do
    if [ "$b" = 1 ]; then args="-p 0 -n 32 -r 1"; else args="-p 0 -n 32 -r 1 --batch $b"; fi
    env ${env//,/ } BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0 timeout 60 $B/bonsai bench --backend cuda -m $P27 $args \
      > "$OUT/prof_${name}_B$b.txt" 2>&1
    echo "== profile $name B=$b rc=$?"
    grep -E "site|norm_kernel|total" "$OUT/prof_${name}_B$b.txt" | head -6
  done
done
stamp "profiles"
grep -E "==|^tg|rc=[1-9]" "$OUT/bench.txt"
