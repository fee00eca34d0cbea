#!/bin/bash
# Per-kernel profiles of decode on the 27b-shape pack (eager launches timed with events, graphs off), one per
# batch size in $BATCHES (default "1 8 32"), into $OUT/profile_B<b>.txt, plus the graph-mode tok/s of the same
# build for reference. PROFILE=2: each file also lists the last step's launches in order (BONSAI_CUDA_PROFILE=2).
# Binaries: DEVBIN=.devbin-me BUILD=build-cuda tests/cuda/stage_devbin.sh; run `bash .devbin-me/device_profile.sh` with carry [".devbin-me"].
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
wait $MP
for b in ${BATCHES:-1 8 32}; do
  if [ "$b" = 1 ]; then args="-p 0 -n 32 -r 1"; else args="-p 0 -n 32 -r 1 --batch $b"; fi
  BONSAI_CUDA_PROFILE=${PROFILE:-1} BONSAI_CUDA_GRAPHS=0 timeout 150 $B/bonsai bench --backend cuda -m "$P27" $args \
    > "$OUT/profile_B$b.txt" 2>&1
  echo "B=$b rc=$?"; grep -E "tok/s|t/s" "$OUT/profile_B$b.txt" | tail -2
done
timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch 8,32 > "$OUT/batch.txt" 2>&1
echo "batch rc=$?"; tail -4 "$OUT/batch.txt"
