#!/bin/bash
# Device run of round 29, in priority order for a short lease (every step's output lands in $OUT as it goes, so a call
# cut off by its limit still brings back what ran): the fixture gate per GATE_ENVS entry, test_cuda (TEST_FILTER), the
# 27b decode A/B (AB: "name:ENV=V,ENV=V ..."; prev* runs bonsai_prev; `bench -p 0 -n 128 -r 2`), compute-sanitizer
# racecheck on RACE_FILTER and memcheck on MEM_FILTER (each at most SAN_TIMEOUT s), the v7 timeline (TRACE=1), then
# FINAL=1 (device_round21.sh's final benches). Staged by stage_devbin.sh; `bash .devbin-me/device_round29.sh` with carry
# [".devbin-me"]. CLUSTER_PROBE=1: tests/cuda/cluster_ffn_probe.cu (compiled there with nvcc) after the tests.
# Round 30: KBENCH=<gtest filter> runs those CudaBench cases (BONSAI_CUDA_BENCH=1) after the probe; at the end every file
# of $OUT is packed into $OUT/out.tgz (a call brings back at most 8 files). Round 31: DELTA_OUT entries of AB run only
# once CudaOps.DeltaStepWithOutProjectionEqualsApart passed (DO_OK), as FFN_FUSED ones need CudaFfnFused (FFN_OK).
# Round 32: KBENCH2 (an ungated kernel bench) and ABB (batched A/B entries, `--batch ${ABB_BATCH:-32}`). Round 33: TG8K.
# Round 36: NCU_FFN=1 (below); GDN_PROBE=1: tests/cuda/gdn_mixer_probe.cu, as CLUSTER_PROBE.
# Round 37: TRACE_ENVS="name:ENV=V,... ..." runs the timeline once per entry (default one run of the defaults: "d:X=1"),
# each report in $OUT/v7trace_report_<name>.txt; PROF2=1: one decode step's launch order with each kernel's eager time
# (BONSAI_CUDA_PROFILE=2, graphs off) into $OUT/prof2.txt.
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
device_header "$OUT/gpu.csv"
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1}" 60
stamp "gates"
if [ -n "${TEST_FILTER:-}" ]; then
  run_test_cuda ${TEST_TIMEOUT:-150}
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|${TEST_SHOW:-@@none@@}" "$OUT/test_cuda.log" | head -${TEST_LINES:-20}
  stamp "test_cuda"
fi
# Round 30: the fused FFN's timed steps only once its tests passed (a hang would spend the call).
FFN_OK=0
grep -q "^\[       OK \] CudaFfnFused.MatchesTheThreeLaunches" "$OUT/test_cuda.log" 2>/dev/null &&
  ! grep -q "^\[  FAILED  \] CudaModel" "$OUT/test_cuda.log" && FFN_OK=1
# Round 31: the same for the delta step's out projection (DELTA_OUT entries).
DO_OK=0
grep -q "^\[       OK \] CudaOps.DeltaStepWithOutProjectionEqualsApart" "$OUT/test_cuda.log" 2>/dev/null &&
  ! grep -q "^\[  FAILED  \] CudaModel" "$OUT/test_cuda.log" && DO_OK=1
echo "FFN_OK=$FFN_OK DO_OK=$DO_OK"
[ "${CLUSTER_PROBE:-0}" = 1 ] && device_probe cluster_ffn_probe 120  # needs no pack
[ "${GDN_PROBE:-0}" = 1 ] && device_probe gdn_mixer_probe 120  # round 36: the GDN mixer as one launch of head groups
if [ -n "${KBENCH:-}" ] && [ $FFN_OK = 1 ]; then
  BONSAI_CUDA_BENCH=1 timeout ${KBENCH_TIMEOUT:-150} $B/test_cuda --gtest_filter="$KBENCH" > "$OUT/kbench.log" 2>&1
  echo "kbench rc=$?"; grep -E "^ffn|^probe|FAILED|Failure" "$OUT/kbench.log" | head -20
  stamp "kbench"
fi
# Round 32: a kernel bench not gated on the fused FFN (KBENCH2=<gtest filter>; pick shapes / variants with
# BONSAI_BENCH_SHAPE / BONSAI_BENCH_TAGS set on the command line), its lines matching KBENCH2_GREP.
if [ -n "${KBENCH2:-}" ]; then
  BONSAI_CUDA_BENCH=1 timeout ${KBENCH_TIMEOUT:-150} $B/test_cuda --gtest_filter="$KBENCH2" > "$OUT/kbench2.log" 2>&1
  echo "kbench2 rc=$?"; grep -E "${KBENCH2_GREP:- M[0-9]+ }|FAILED|Failure" "$OUT/kbench2.log" | head -${KBENCH2_LINES:-30}
  stamp "kbench2"
fi
wait $MP
stamp "27b pack"
pick() { case $1 in prev*) echo $B/bonsai_prev ;; *) echo $B/bonsai ;; esac; }
for cfg in ${AB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}; bin=$(pick $name)
  case $env in *FFN_FUSED=1*) [ $FFN_OK = 1 ] || { echo "== $name skipped (FFN_OK=0)"; continue; } ;; esac
  case $env in *DELTA_OUT*) [ $DO_OK = 1 ] || { echo "== $name skipped (DO_OK=0)"; continue; } ;; esac
  echo "== $name ($env, $(basename $bin))" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 90 $bin bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 2>&1 | grep -E "^tg|rror" \
    | tee -a "$OUT/ab.txt"
done
stamp "A/B"
# Round 32: batched A/B entries (ABB, the same "name:ENV=V,..." form; `bench -p 0 -n 32 -r 2 --batch ${ABB_BATCH:-32}`).
for cfg in ${ABB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}; bin=$(pick $name)
  echo "== batch $name ($env, $(basename $bin))" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 90 $bin bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch ${ABB_BATCH:-32} 2>&1 \
    | grep -E "^tg|batch|rror" | tail -3 | tee -a "$OUT/ab.txt"
done
[ -n "${ABB:-}" ] && stamp "batch A/B"
# Round 33: TG8K entries (the same "name:ENV=V,..." form): `bench -p 0 -n 128 -r 2 -d 0,8192`, batch 1 at short and 8k
# context, for a switch about to become the default (FFN_FUSED entries only once FFN_OK).
for cfg in ${TG8K:-}; do
  name=${cfg%%:*}; env=${cfg#*:}; bin=$(pick $name)
  case $env in *FFN_FUSED=1*) [ $FFN_OK = 1 ] || { echo "== $name skipped (FFN_OK=0)"; continue; } ;; esac
  echo "== tg8k $name ($env, $(basename $bin))" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 120 $bin bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 -d 0,8192 2>&1 | grep -E "^tg|rror" \
    | tee -a "$OUT/ab.txt"
done
[ -n "${TG8K:-}" ] && stamp "tg8k"
[ -n "${RACE_FILTER:-}" ] && SAN_TOOLS=racecheck run_sanitizer "$RACE_FILTER" ${SAN_TIMEOUT:-100}
[ -n "${MEM_FILTER:-}" ] && SAN_TOOLS=memcheck run_sanitizer "$MEM_FILTER" ${SAN_TIMEOUT:-100}
stamp "sanitizer"
if [ "${TRACE:-0}" = 1 ]; then
  for entry in ${TRACE_ENVS:-d:X=1}; do
    name=${entry%%:*}
    env $(echo "${entry#*:}" | tr , " ") BONSAI_CUDA_MV7_TRACE=$L/v7trace.txt timeout 90 $B/bonsai_trace bench --backend cuda -m "$P27" \
      -p 0 -n 16 -r 1 > "$L/trace_bench.txt" 2>&1
    echo "trace $name rc=$?"
    python3 $B/v7_trace_report.py $L/v7trace.txt > "$OUT/v7trace_report_$name.txt" 2>&1
    head -${TRACE_LINES:-50} "$OUT/v7trace_report_$name.txt"
  done
  stamp "trace"
fi
if [ "${PROF2:-0}" = 1 ]; then
  BONSAI_CUDA_PROFILE=2 BONSAI_CUDA_GRAPHS=0 timeout 90 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 4 -r 1 \
    > "$OUT/prof2.txt" 2>&1
  echo "prof2 rc=$?"; grep -n "launch order" "$OUT/prof2.txt"
  stamp "prof2"
fi
# Round 36: NCU_FFN=1: Nsight Compute on one fused-FFN launch of the 27b decode (eager, past the first tokens), alone
# (ncu serialises the launches): its duration, DRAM / SM throughput and warp stalls (phase A streams at ~65 % of the
# probe in the kernel bench).
if [ "${NCU_FFN:-0}" = 1 ] && [ $FFN_OK = 1 ] && command -v ncu > /dev/null; then
  BONSAI_CUDA_GRAPHS=0 timeout ${NCU_TIMEOUT:-120} ncu --clock-control none -k "regex:ffn_fused_kernel" --launch-skip 192 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 8 -r 1 > "$OUT/ncu_ffn.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Issue Slots|No Eligible|Warp Cycles Per Issued|Stall|L2 Hit|Mem Busy|Max Bandwidth" \
    "$OUT/ncu_ffn.txt" | head -${NCU_LINES:-30}
  stamp "ncu"
fi
if [ "${FINAL:-0}" = 1 ]; then
  timeout 150 $B/bonsai bench --backend cuda -m "$P27" -p 512,2048 -n 128 -r 2 -d 0,8192 --json > "$OUT/bench.json" 2> "$OUT/bench.txt"
  echo "bench rc=$?"; tail -6 "$OUT/bench.txt"
  timeout 100 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch 4,8,16,32 > "$OUT/batch.txt" 2>&1
  echo "batch rc=$?"; tail -4 "$OUT/batch.txt"
fi
stamp "done"
(cd "$OUT" && tar czf "$L/out.tgz" . && rm -rf "$OUT"/* && mv "$L/out.tgz" "$OUT/")
