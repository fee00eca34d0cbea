#!/bin/bash
# Device run of round 23 (decode attention through the bulk-copy ring): with NCU_RING=1 first an Nsight Compute page of
# attention_ring_kernel on CudaOps.AttentionDecodeRing's 8,191-position case (27B shapes: Hq 24, Hkv 4, D 256; the 21st
# ring launch of the test) into $OUT/ncu_ring.txt, then device_round21.sh with the same options (tests, gates, A/Bs).
# Binaries: DEVBIN=.devbin-me BUILD=build STAGE_GZ=1 tests/cuda/stage_devbin.sh; run `bash .devbin-me/device_round23.sh`
# with carry [".devbin-me"].
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
if [ "${NCU_RING:-0}" = 1 ] && command -v ncu > /dev/null; then
  timeout 200 ncu --clock-control none -k regex:attention_ring --launch-skip 20 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section LaunchStats $B/test_cuda --gtest_filter='CudaOps.AttentionDecodeRing' > "$OUT/ncu_ring.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Duration|DRAM Throughput|Registers Per|Issued Warp|No Eligible|Warp Cycles Per Issued|Grid Size" "$OUT/ncu_ring.txt"
  stamp "ncu"
fi
source "$B/device_round21.sh"
