# Sourced by the tests/cuda/device_*.sh scripts (never run alone): the setup they share. They run on the
# device from the repository root, their binaries staged in .devbin/ (or $DEVBIN) by stage_devbin.sh, which
# copies this file there too: the binaries are the ones beside this file, so two staged builds can travel at once.
#   B     the staged binaries;  OUT  what comes back ($OUT, else /tmp/out);  L  logs that stay on the device
#   FIX   the HF fixture of the tiny seed-7 pack;  P27  the 27b-shape pack once make_27b_pack has run
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH=$B
OUT=${OUT:-/tmp/out}
L=/tmp/logs
FIX=$PWD/tests/data/fixtures/tiny_seed7.safetensors
P27=/tmp/p27/27b-pq2_0.gguf
mkdir -p "$OUT" "$L"
# Binaries staged gzipped (stage_devbin.sh STAGE_GZ=1: a carry is at most 64 MiB with the working tree) are unpacked here.
for z in "$B"/*.gz; do [ -e "$z" ] && { [ -e "${z%.gz}" ] || { gunzip -k "$z" && chmod +x "${z%.gz}"; }; }; done
# stamp MSG: "[t+Ns] MSG", N the seconds since the script sourced this file.
T0=$(date +%s)
stamp() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }

# The GPU and its clocks (optionally also into file $1), and stop if bonsai cannot start (a missing library).
device_header() {
  if [ $# -gt 0 ]; then
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$1"
  else
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader
  fi
  $B/bonsai --help > /dev/null 2>&1 || { echo "bonsai does not start"; ldd $B/bonsai; exit 1; }
}

# The tiny packs the tests and the gate read: /tmp/tiny (seed 1) and /tmp/tiny7 (seed 7, the fixture's).
make_tiny_packs() {
  $B/bonsai make-pack --preset tiny --format gguf-pq2_0 -o /tmp/tiny > /dev/null 2>&1
  $B/bonsai make-pack --preset tiny --seed 7 --format gguf-pq2_0 -o /tmp/tiny7 > /dev/null 2>&1
}

# The 27b-shape pack, written in the background (MP = its pid; empty with SKIP_27B=1, then `wait $MP` waits for
# nothing), its log into $1 (default $L/makepack.log).
start_27b_pack() {
  MP=
  [ "${SKIP_27B:-0}" = 1 ] && return 0
  ( $B/bonsai make-pack --preset 27b -o /tmp/p27 > "${1:-$L/makepack.log}" 2>&1 ) &
  MP=$!
}

# test_cuda against the tiny packs and the fixture (TEST_FILTER; default: all but the benches) into
# $OUT/test_cuda.log, at most $1 seconds; prints its exit status.
run_test_cuda() {
  BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf BONSAI_TINY7_PACK=/tmp/tiny7/tiny-pq2_0.gguf BONSAI_GATE_FIXTURE="$FIX" \
    timeout "$1" $B/test_cuda --gtest_filter="${TEST_FILTER:--CudaBench.*}" > "$OUT/test_cuda.log" 2>&1
  echo "test_cuda rc=$?"
}

# The fixture gate (`bonsai gate --json` on the seed-7 tiny pack) once per entry of $1 ("ENV=V,ENV=V"; X=1: the
# defaults), each at most $2 seconds (default 40); each entry's "overall" line into $OUT/gate.txt. A timeout is a hang:
# the script stops there.
run_gates() {
  local e rc
  for e in $1; do
    env ${e//,/ } timeout "${2:-40}" $B/bonsai gate -m /tmp/tiny7/tiny-pq2_0.gguf --fixture "$FIX" --backend cuda --json \
      > "$L/gate.json" 2> "$L/gate.err"
    rc=$?
    echo "gate $e rc=$rc $(tr -d '\n' < "$L/gate.json" | grep -oE '"overall"[^}]*}' | head -c 300)" | tee -a "$OUT/gate.txt"
    [ $rc = 124 ] && [ "${GATE_NOSTOP:-0}" != 1 ] && { echo "gate timed out (a hang): stop"; tail -5 "$L/gate.err"; exit 1; }
  done
}

# compute-sanitizer (each tool of SAN_TOOLS, default memcheck) of test_cuda on gtest filter $1 (at most $2 seconds each)
# into $OUT/sanitizer_<tool>.log, then its summary lines (and those matching the extra pattern $3, if given).
run_sanitizer() {
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$cs" ]; then echo "no compute-sanitizer"; return 0; fi
  local tool
  for tool in ${SAN_TOOLS:-memcheck}; do  # memcheck, racecheck, synccheck, initcheck
    BONSAI_TINY_PACK=/tmp/tiny/tiny-pq2_0.gguf timeout "$2" "$cs" --tool $tool --print-limit 20 $B/test_cuda \
      --gtest_filter="$1" > "$OUT/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED${3:+|$3}" \
      "$OUT/sanitizer_$tool.log" | head -12
  done
}

# The per-kernel profile (BONSAI_CUDA_PROFILE=1, eager launches) of one prefill of each size in $2 per entry of $1
# ("name:ENV=V,ENV=V"; X=1: the defaults) into $OUT/prof_<name>_<size>.txt; prints the lines matching $3 (default:
# the table's first 16 lines). Needs the 27b pack.
run_prefill_profiles() {
  local cfg name env p
  for cfg in $1; do
    name=${cfg%%:*}; env=${cfg#*:}
    for p in $2; do
      env ${env//,/ } BONSAI_CUDA_PROFILE=1 BONSAI_CUDA_GRAPHS=0 timeout 120 $B/bonsai bench --backend cuda -m $P27 -p $p \
        -n 0 -r 1 > "$L/prof_bench.txt" 2> "$OUT/prof_${name}_$p.txt"
      echo "== profile $name ($env) pp$p rc=$?: two prefills"
      if [ -n "${3:-}" ]; then grep -E "$3" "$OUT/prof_${name}_$p.txt" | head -8; else head -16 "$OUT/prof_${name}_$p.txt"; fi
    done
  done
}

# `bonsai bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2` per entry of $1 ("name:ENV=V,ENV=V" in the order given;
# a name starting with base runs the BASELINE binary that stage_devbin.sh staged as bonsai_r5, with prev a bonsai_prev
# copied beside it) into $OUT/bench.txt,
# then the pp lines. Needs the 27b pack.
run_prefill_bench() {
  local cfg name env bin
  for cfg in $1; do
    name=${cfg%%:*}; env=${cfg#*:}
    bin=$B/bonsai; case $name in base*) bin=$B/bonsai_r5 ;; prev*) bin=$B/bonsai_prev ;; esac
    echo "== $name ($env, $(basename $bin)): bonsai bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2" >> "$OUT/bench.txt"
    env ${env//,/ } timeout 150 $bin bench --backend cuda -m $P27 -p 512,2048 -n 0 -r 2 >> "$OUT/bench.txt" 2>&1
    echo "rc=$?" >> "$OUT/bench.txt"
  done
  grep -E "==|^pp|rc=" "$OUT/bench.txt"
}

# `bonsai bench --backend cuda -m $P27 -p 0 -n 32 -r 2 --batch 32` per entry of $1 ("name:ENV=V,ENV=V"; X=1: the
# defaults), its tg and error lines printed and appended to $OUT/bab.txt. Needs the 27b pack.
run_batch_bench() {
  local cfg name env
  for cfg in $1; do
    name=${cfg%%:*}; env=${cfg#*:}
    echo "== $name ($env)" | tee -a "$OUT/bab.txt"
    env ${env//,/ } timeout 120 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 32 -r 2 --batch 32 2>&1 | grep -E "^tg|rror" \
      | tee -a "$OUT/bab.txt"
  done
}

# device_probe NAME TIMEOUT: compile tests/cuda/NAME.cu here with nvcc (the kernels' headers on the include path) and
# run it, its output into $OUT/NAME.txt.
device_probe() {
  $(command -v nvcc || echo /usr/local/cuda/bin/nvcc) -O3 -arch=sm_90a -std=c++17 -Isrc tests/cuda/$1.cu -o $L/$1 \
    > $L/$1_build.log 2>&1 && timeout $2 $L/$1 | tee "$OUT/$1.txt" || { echo "$1 failed"; tail -5 $L/$1_build.log; }
  stamp "$1"
}
