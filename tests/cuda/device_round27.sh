#!/bin/bash
# Device run of round 27: device_round21.sh (all of its options) after two optional steps on the 27b pack:
#   BATCH_CHECK="name:B:ENV=V,ENV=V ..."  `bench -p 0 -n 4 -r 1 --batch B` per entry: its exit status and tg / error lines
#   MEMCHECK="B:ENV=V,ENV=V"              the same bench (-n 1) once under compute-sanitizer memcheck: its first errors
# Staged and run as device_round21.sh: `bash .devbin-me/device_round27.sh` with carry [".devbin-me"].
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
if [ -n "${BATCH_CHECK:-}${MEMCHECK:-}" ]; then
  device_header
  start_27b_pack
  wait $MP
  stamp "27b pack"
  for spec in ${BATCH_CHECK:-}; do
    IFS=: read -r name nb envs <<< "$spec"
    env ${envs//,/ } timeout 90 $B/bonsai bench --backend cuda -m $P27 -p 0 -n 4 -r 1 --batch $nb > "$L/bc.txt" 2>&1
    echo "batch check $name B=$nb ($envs) rc=$?: $(grep -E '^tg|rror' "$L/bc.txt" | head -3 | tr '\n' ' ')" \
      | tee -a "$OUT/batch_check.txt"
  done
  if [ -n "${MEMCHECK:-}" ]; then
    IFS=: read -r nb envs <<< "$MEMCHECK"
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    env ${envs//,/ } timeout 150 "$cs" --tool memcheck --print-limit 10 $B/bonsai bench --backend cuda -m $P27 -p 0 -n 1 \
      -r 1 --batch $nb > "$OUT/bench_memcheck.txt" 2>&1
    echo "memcheck of --batch $nb ($envs) rc=$?"; grep -E "=========|rror" "$OUT/bench_memcheck.txt" | head -40
  fi
  stamp "batch checks"
  export SKIP_27B=1  # the pack is written
fi
bash "$B/device_round21.sh"
