#!/bin/bash
# Round 11 device run (prefill: the warp site staged through shared memory, the norm fused into it, the dense a/b tile
# kernel's hoisted loads, the float4 split-K sum). Binaries built here (DEVBIN=.devbin-pf BUILD=build-cuda-pf [BASELINE=<an earlier bonsai>]
# tests/cuda/stage_devbin.sh), carried in .devbin-pf. In order: the fixture gate per GATE_ENVS entry; test_cuda
# (TEST_FILTER; SKIP_TESTS=1: none); compute-sanitizer memcheck on SANITIZE_FILTER (SANITIZE=0: none); the per-kernel
# profile (BONSAI_CUDA_PROFILE=1) of one prefill of each size in PROF_SIZES per PROF_CONFIGS entry; then `bonsai
# bench -p 512,2048 -n 0 -r 2` per CONFIGS entry in the order given (a name starting with base runs the staged
# BASELINE binary, .devbin-pf/bonsai_r5). Round 11b (GEMM v3's folded split, BONSAI_CUDA_GEMM3_FOLD=0: off) ran it as
# GATE_ENVS="X=1 BONSAI_CUDA_GEMM3_FOLD=0" TEST_FILTER=... SANITIZE_FILTER=CudaOps.GemmV3Folded* SANITIZE_TIMEOUT=...
# PROF_CONFIGS="on:X=1 off:BONSAI_CUDA_GEMM3_FOLD=0" CONFIGS="on:X=1 off:BONSAI_CUDA_GEMM3_FOLD=0 on:X=1".
# $OUT: gate.txt, test_cuda.log, sanitizer.log, prof_<name>_<size>.txt, bench.txt.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
make_tiny_packs
stamp "tiny packs"
run_gates "${GATE_ENVS:-X=1 BONSAI_CUDA_SITE_STAGE=0 BONSAI_CUDA_SITE_NORM_WARP=1 BONSAI_CUDA_DENSE_HOIST=0}" 60
stamp "gates"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test_cuda "${TEST_TIMEOUT:-240}"
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|rel_err" "$OUT/test_cuda.log" | head -30
  stamp "test_cuda"
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  run_sanitizer "${SANITIZE_FILTER:-CudaSite.NormWarpEqualsUnfusedNormAndWarpSite:CudaOps.DenseLinearSingleAndPaired}" \
    "${SANITIZE_TIMEOUT:-200}"
  stamp "sanitizer"
fi
wait $MP
stamp "27b pack"
run_prefill_profiles "${PROF_CONFIGS:-new:X=1}" "${PROF_SIZES:-2048}"
# PROF2=1: the per-launch list (BONSAI_CUDA_PROFILE=2) of one 256-token prefill chunk (the last synchronised batch).
if [ "${PROF2:-0}" = 1 ]; then
  BONSAI_CUDA_PROFILE=2 timeout 120 $B/bonsai bench --backend cuda -m $P27 -p 256 -n 0 -r 1 > "$L/prof_bench.txt" 2> "$OUT/prof2_256.txt"
  echo "== launch list rc=$?"
fi
stamp "profiles"
run_prefill_bench "${CONFIGS:-new:X=1 base:X=1 new:X=1 base:X=1}"
stamp "bench"
