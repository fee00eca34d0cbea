#!/bin/bash
# The device checks of sampling on the device and the batch-1 argmax (CudaSampling.*, CudaModel.NextToken*,
# CudaModel.BatchedStep*), then (TG=1) greedy tg128 at 27b shapes. Binaries staged by
# `DEVBIN=.devbin-me BUILD=build-cuda tests/cuda/stage_devbin.sh`; run as `bash .devbin-me/device_sampling.sh`.
source "$(dirname "$0")/device_env.sh"
device_header
[ "${TG:-0}" = 1 ] && start_27b_pack
make_tiny_packs
TEST_FILTER="${TEST_FILTER:-CudaSampling.*:CudaModel.NextToken*:CudaModel.BatchedStep*}" run_test_cuda 300
grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure|Expected|Which|rank|step" "$OUT/test_cuda.log" | head -40
if [ "${TG:-0}" = 1 ]; then
  wait $MP
  $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 2>&1 | tail -3
fi
