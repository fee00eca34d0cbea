#!/bin/bash
# Round 11: ncu on single v7 launches inside the 27b decode (graphs off), one report per NCU entry
# "name:kernel-regex:launches-to-skip:ENV=V,ENV=V" into $OUT/ncu_<name>.txt (WarpStateStats shows the stall reasons,
# "No Instruction" = instruction-cache misses). Binaries as device_round11_decode.sh.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
wait $MP
for spec in ${NCU:-}; do
  IFS=: read -r name k skip env <<< "$spec"
  env ${env//,/ } BONSAI_CUDA_GRAPHS=0 timeout 150 ncu --clock-control none --kernel-name-base mangled -k "regex:$k" --launch-skip $skip --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --page raw \
    $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 2 -r 1 > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name rc=$?"
  grep -E "gpu__time_duration.sum|issue_stalled.*per_warp_active|smsp__inst_executed.sum |launch__registers|launch__grid_size" "$OUT/ncu_$name.txt" \
    | awk '$NF+0 > 0.5 || /duration|inst_executed|launch__/ {print $1, $(NF-1), $NF}' | head -30
done
