#!/bin/bash
# Round 12: ncu (--set full, caches not flushed: the scan reads what the prep left in L2) on one launch of each
# kernel matching NCU_K inside the 27b prefill (-p 256: one chunk per prefill; launches alternate prep, scan), skipping
# NCU_SKIP matches. Reports: $OUT/ncu.ncu-rep, its details page (ncu_details.txt), raw page (ncu_raw.txt) and SASS with
# per-instruction counters (ncu_sass_<n>.csv). Binaries as device_round12_delta.sh.
set -u
source "$(dirname "$0")/device_env.sh"
device_header
start_27b_pack
wait $MP
stamp "27b pack"
env ${NCU_ENV:-X=1} BONSAI_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none --set full \
  --import-source no -k "regex:${NCU_K:-delta_(prep2|scan2)_kernel}" --launch-skip ${NCU_SKIP:-50} \
  --launch-count ${NCU_COUNT:-2} -o "$OUT/ncu" $B/bonsai bench --backend cuda -m "$P27" -p 256 -n 0 -r 1 \
  > "$L/ncu.log" 2>&1
echo "ncu rc=$?"; tail -3 "$L/ncu.log"
stamp "ncu"
ncu -i "$OUT/ncu.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
ncu -i "$OUT/ncu.ncu-rep" --page raw > "$OUT/ncu_raw.txt" 2>&1
for n in $(seq 0 $(( ${NCU_COUNT:-2} - 1 ))); do
  ncu -i "$OUT/ncu.ncu-rep" --page source --csv --print-source sass --launch-skip $n --launch-count 1 \
    > "$OUT/ncu_sass_$n.csv" 2>&1
done
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|L2 Hit Rate|DRAM Throughput|Executed Ipc A" "$OUT/ncu_details.txt" | head -40
stamp "reports"
