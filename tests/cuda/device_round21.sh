#!/bin/bash
# Device run of rounds 19-21 (device_round19.sh runs this with the same options; round 21 added PROF): tests, gates and
# benches, an A/B against an earlier build. Binaries: DEVBIN=.devbin-me BUILD=build STAGE_GZ=1 tests/cuda/stage_devbin.sh,
# plus an earlier build's bonsai / test_cuda copied in as bonsai_prev / test_cuda_prev (gzipped); run
# `bash .devbin-me/device_round21.sh` with carry [".devbin-me"]. In order:
#   the fixture gate per GATE_ENVS entry, test_cuda (TEST_FILTER), compute-sanitizer (SAN_FILTER; SAN_TOOLS, default memcheck), test_engine (ENGINE_FILTER),
#   BENCH_SHAPES="gate+up M32,..."  the kernel table (CudaBench.ProbeAndTernaryKernels, tags BENCH_TAGS) of test_cuda
#                                   and of test_cuda_prev, KT_REPS times each (default 1), alternated
#   then on the 27b pack, per entry "name:ENV=V,ENV=V" (a name prev* runs bonsai_prev, alt* bonsai_alt; repeat entries
#   to bracket drift):
#   PAB   `bench -p $PP -n 0 -r $PR` (PP default 512,2048, PR 2)
#   BAB   `bench -p 0 -n 32 -r 2 --batch $BATCHES` (BATCHES default 16,32)
#   AB    `bench -p 0 -n 128 -r 2 -d $DEPTHS` (DEPTHS default 0)
#   KT_ENVS="name:ENV=V,ENV=V ..." (round 20) the kernel table of test_cuda once more per entry, under its environment
#   WGMMA=1  (round 20) CudaBench.WgmmaCeiling of test_cuda: the int8 rate of GEMM v3's consumer loop, operands resident
#   SASS=<regex> (round 20) cuobjdump -sass of test_cuda's kernels whose names match, into $OUT/sass.txt
#   PROF="name:B:ENV=V,ENV=V ..." (round 21) the eager per-kernel profile (BONSAI_CUDA_PROFILE=1, no graphs) of 8 decode
#            steps of B sequences (B 0: one sequence, no --batch) per entry into $OUT/prof_<name>.txt, its top lines
#            (round 23: at context PROF_DEPTH, default 0; the fill's kernels are in the profile too)
#   STATE_PROBE=1 (round 22) the state read-modify-write ceiling (tests/cuda/state_stream_probe.cu, compiled here with nvcc)
#   BULK_PROBE=1 (round 23) one SM's cp.async.bulk rate by copy size and depth (tests/cuda/bulk_copy_probe.cu, the same way)
#   CLUSTER_PROBE=1 (round 29) an FFN's gate+up and ffn_down meeting at a cluster barrier instead of a launch boundary
#            (tests/cuda/cluster_ffn_probe.cu, the same way)
#   PERSIST_PROBE=1 (round 28) the decode chain's weight streams as per-product launches vs one persistent kernel with
#            grid barriers (tests/cuda/persist_chain_probe.cu, the same way)
#   TRACE=1  (round 24) the v7 timeline of a decode step (bonsai_trace: stage_devbin.sh TRACE_BUILD) at context
#            TRACE_DEPTH (default 0): $OUT/v7trace.txt.gz and v7_trace_report.py's table
#   NCU="name:kernel regex:tags:shape;..." (round 25) ncu --set full of one kernel-bench launch per entry (e.g.
#            "ffn:matvec7_kernel:q16 v7 pdl:ffn_down"): $OUT/ncu_<name>.txt (details) and sass_<name>.csv.gz (per SASS
#            instruction stall samples)
#   NCU_MODEL="name:kernel regex:skip:count" (round 25) ncu --set full of `count` launches of the kernels matching the regex
#            in a decode of the 27b pack (B = 1, graph nodes), after `skip` of them: $OUT/ncu_<name>.txt, sass_<name>.csv.gz
#   FINAL=1  the default binary's `bench -p 512,2048 -n 128 -r 2 -d 0,8192 --json` and the batches 4,8,16,32
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
device_header "$OUT/gpu.csv"
start_27b_pack
make_tiny_packs
run_gates "${GATE_ENVS:-X=1}" 60
stamp "gates"
if [ -n "${TEST_FILTER:-}" ]; then
  run_test_cuda ${TEST_TIMEOUT:-200}
  grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is" "$OUT/test_cuda.log" | head -20
  stamp "test_cuda"
fi
[ -n "${SAN_FILTER:-}" ] && { run_sanitizer "$SAN_FILTER" ${SAN_TIMEOUT:-90}; stamp "sanitizer"; }
if [ -n "${ENGINE_FILTER:-}" ]; then
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout 90 $B/test_engine --gtest_filter="$ENGINE_FILTER" > "$OUT/test_engine.log" 2>&1
  echo "test_engine rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/test_engine.log" | head -5
fi
if [ "${WGMMA:-0}" = 1 ]; then
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$L timeout 120 $B/test_cuda --gtest_filter=CudaBench.WgmmaCeiling > "$L/wgmma.log" 2>&1
  echo "wgmma ceiling rc=$?"; cat "$L/bench_wgmma.txt" 2>/dev/null | tee "$OUT/wgmma.txt"
  stamp "wgmma ceiling"
fi
[ "${STATE_PROBE:-0}" = 1 ] && device_probe state_stream_probe 60
[ "${BULK_PROBE:-0}" = 1 ] && device_probe bulk_copy_probe 120
[ "${PERSIST_PROBE:-0}" = 1 ] && device_probe persist_chain_probe 120
[ "${CLUSTER_PROBE:-0}" = 1 ] && device_probe cluster_ffn_probe 120
if [ -n "${SASS:-}" ]; then
  cuobjdump -sass $B/test_cuda 2>/dev/null | awk -v re="$SASS" '/Function :/ {on = ($0 ~ re)} on' > "$OUT/sass.txt"
  echo "sass lines: $(wc -l < "$OUT/sass.txt")"; gzip -9 "$OUT/sass.txt"
fi
# ncu_export NAME REGEX LINES (after an ncu run into $L/ncu_NAME; $? its status): the details page and the per-SASS
# stall table into $OUT, the details' lines matching REGEX (at most LINES) on stdout.
ncu_export() {
  echo "ncu $1 rc=$?"; tail -2 "$L/ncu_$1.log"
  ncu -i "$L/ncu_$1.ncu-rep" --page details --print-details all > "$OUT/ncu_$1.txt" 2>&1
  ncu -i "$L/ncu_$1.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip -9 > "$OUT/sass_$1.csv.gz"
  grep -E "$2" "$OUT/ncu_$1.txt" | head -$3
  stamp "ncu $1"
}
IFS=';' read -ra NCU_ENTRIES <<< "${NCU:-}"
for spec in "${NCU_ENTRIES[@]}"; do
  IFS=: read -r name kre tags shape <<< "$spec"
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$L BONSAI_BENCH_SHAPE="$shape" BONSAI_BENCH_TAGS="$tags" timeout 240 ncu --set full \
    --import-source no --clock-control none -k "regex:$kre" --launch-skip 3 --launch-count 1 -f -o "$L/ncu_$name" \
    $B/test_cuda --gtest_filter=CudaBench.ProbeAndTernaryKernels > "$L/ncu_$name.log" 2>&1
  ncu_export $name "Duration|Registers Per|Issued Warp|Bank Conflicts|No Eligible" 12
done
kernel_table() {  # $1 binary, $2 label
  BONSAI_CUDA_BENCH=1 BONSAI_BENCH_OUT=$L BONSAI_BENCH_SHAPE="$BENCH_SHAPES" BONSAI_BENCH_TAGS="${BENCH_TAGS:-q16 v3 pdl,q16 v3occ2 pdl}" \
    timeout 200 "$1" --gtest_filter=CudaBench.ProbeAndTernaryKernels > "$L/bench_kernels_$2.log" 2>&1
  echo "kernel bench $2 rc=$?"; cat "$L/bench_kernels.txt" 2>/dev/null >> "$OUT/kernels.txt"
  echo "== $2" ; grep -vE '^shape' "$L/bench_kernels.txt" 2>/dev/null; rm -f "$L/bench_kernels.txt"
}
if [ -n "${BENCH_SHAPES:-}" ]; then
  for i in $(seq ${KT_REPS:-1}); do kernel_table $B/test_cuda new$i; [ -x $B/test_cuda_prev ] && kernel_table $B/test_cuda_prev prev$i; done
  for cfg in ${KT_ENVS:-}; do e=${cfg#*:}; env ${e//,/ } bash -c "$(declare -f kernel_table); B=$B L=$L OUT=$OUT BENCH_SHAPES='$BENCH_SHAPES' BENCH_TAGS='${BENCH_TAGS:-}' kernel_table $B/test_cuda ${cfg%%:*}"; done
  stamp "kernel tables"
fi
wait $MP
stamp "27b pack"
pick() { case $1 in prev*) echo $B/bonsai_prev ;; alt*) echo $B/bonsai_alt ;; *) echo $B/bonsai ;; esac; }  # alt*: round 25
for cfg in ${PAB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}; bin=$(pick $name)
  echo "== $name ($env, $(basename $bin))" | tee -a "$OUT/pab.txt"
  env ${env//,/ } timeout 150 $bin bench --backend cuda -m "$P27" -p ${PP:-512,2048} -n 0 -r ${PR:-2} 2>&1 \
    | grep -E "^pp|rror" | tee -a "$OUT/pab.txt"
done
for cfg in ${BAB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}; bin=$(pick $name)
  echo "== $name ($env, $(basename $bin))" | tee -a "$OUT/bab.txt"
  env ${env//,/ } timeout 120 $bin bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch ${BATCHES:-16,32} 2>&1 \
    | grep -E "^tg|rror" | tee -a "$OUT/bab.txt"
done
for cfg in ${PROF:-}; do
  name=${cfg%%:*}; rest=${cfg#*:}; nb=${rest%%:*}; env=${rest#*:}
  bat=; [ "$nb" != 0 ] && bat="--batch $nb"
  env ${env//,/ } BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0 timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 \
    -n 8 -r 1 -d ${PROF_DEPTH:-0} $bat > "$L/prof_bench.txt" 2> "$OUT/prof_$name.txt"
  echo "== profile $name (B $nb, $env) rc=$?"; head -${PROF_LINES:-16} "$OUT/prof_$name.txt"
done
for cfg in ${AB:-}; do
  name=${cfg%%:*}; env=${cfg#*:}; bin=$(pick $name)
  echo "== $name ($env, $(basename $bin))" | tee -a "$OUT/ab.txt"
  env ${env//,/ } timeout 150 $bin bench --backend cuda -m "$P27" -p 0 -n 128 -r 2 -d ${DEPTHS:-0} 2>&1 \
    | grep -E "^tg|rror" | tee -a "$OUT/ab.txt"
done
if [ -n "${NCU_MODEL:-}" ]; then
  IFS=: read -r name kre skip cnt <<< "$NCU_MODEL"
  timeout 300 ncu --set full --import-source no --clock-control none -k "regex:$kre" --launch-skip $skip \
    --launch-count $cnt -f -o "$L/ncu_$name" $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 8 -r 1 > "$L/ncu_$name.log" 2>&1
  ncu_export $name "^  [a-z_].*\(|Duration" 24
fi
if [ "${TRACE:-0}" = 1 ]; then
  BONSAI_CUDA_MV7_TRACE=$L/v7trace.txt timeout 120 $B/bonsai_trace bench --backend cuda -m "$P27" -p 0 -n 16 -r 1 \
    -d ${TRACE_DEPTH:-0} > "$L/trace_bench.txt" 2>&1
  echo "trace rc=$?"; python3 $B/v7_trace_report.py $L/v7trace.txt | tee "$OUT/v7trace_report.txt"
  gzip -c $L/v7trace.txt > "$OUT/v7trace.txt.gz"
fi
if [ "${FINAL:-0}" = 1 ]; then
  timeout 200 $B/bonsai bench --backend cuda -m "$P27" -p 512,2048 -n 128 -r 2 -d 0,8192 --json > "$OUT/bench.json" 2> "$OUT/bench.txt"
  echo "bench rc=$?"; tail -6 "$OUT/bench.txt"
  timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch 4,8,16,32 > "$OUT/batch.txt" 2>&1
  echo "batch rc=$?"; tail -4 "$OUT/batch.txt"
fi
stamp "done"
