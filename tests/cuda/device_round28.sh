#!/bin/bash
# Device run of round 28: device_round27.sh (all of its options, and so device_round21.sh's) after an optional step on
# the 27b pack:
#   PROF_PP="name:ENV=V,ENV=V ..."  the eager per-kernel profile of one prefill of each size in PPS (default 2048) per
#                                   entry (run_prefill_profiles): $OUT/prof_<name>_<size>.txt and its first lines
# Staged and run as device_round21.sh: `bash .devbin-me/device_round28.sh` with carry [".devbin-me"].
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
if [ -n "${PROF_PP:-}" ]; then
  device_header
  start_27b_pack
  wait $MP
  stamp "27b pack"
  PROF_LINES_PP=${PROF_LINES_PP:-24}
  run_prefill_profiles "$PROF_PP" "${PPS:-2048}" > "$L/pp_prof.txt"
  grep -E "^==" "$L/pp_prof.txt"
  for f in "$OUT"/prof_*_*.txt; do echo "-- $f"; head -$PROF_LINES_PP "$f"; done
  stamp "prefill profiles"
  export SKIP_27B=1  # the pack is written
fi
bash "$B/device_round27.sh"
