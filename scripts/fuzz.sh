#!/usr/bin/env bash
# Bounded libFuzzer runs of the file-format parsers (GGUF, safetensors) under ASan + UBSan.
#   bash scripts/fuzz.sh [SECONDS per target, default 60]
# Builds build-fuzz/ with clang (separate from build/), writes a seed corpus with our own writers, runs
# each target for SECONDS, prints its exec count, and exits non-zero if any target finds a crash, a
# sanitizer report, a leak, a timeout or an escaping exception (the reproducer is left in
# build-fuzz/fuzz-artifacts/). New corpus entries accumulate in build-fuzz/fuzz-corpus/ across runs.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
build=build-fuzz

CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBONSAI_FUZZ=ON -DBONSAI_TESTS=OFF -DBONSAI_BENCH=OFF -DBONSAI_CUDA=OFF >/dev/null
cmake --build "$build" --target fuzz_gguf fuzz_safetensors fuzz_seeds -j"$(nproc)"

seeds="$build/fuzz-seeds"
rm -rf "$seeds"
"$build/fuzz/fuzz_seeds" "$seeds"

status=0
run_target() {  # name max_len
  local name=$1 max_len=$2
  local corpus="$build/fuzz-corpus/$name" artifacts="$build/fuzz-artifacts" log="$build/fuzz-$name.log"
  mkdir -p "$corpus" "$artifacts"
  local rc=0
  "$build/fuzz/fuzz_$name" "$corpus" "$seeds/$name" \
    -max_total_time="$secs" -rss_limit_mb=2048 -max_len="$max_len" -timeout=10 \
    -dict="fuzz/$name.dict" -artifact_prefix="$artifacts/$name-" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  local execs
  execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
  echo "fuzz_$name: ${execs:-?} execs in ${secs}s ($(grep -m1 -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" || echo 'no summary'))"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz_$name: FAILED (exit $rc); log $log; reproducer(s):" >&2
    ls "$artifacts"/"$name"-* >&2 2>/dev/null || true
    tail -n 60 "$log" >&2
    status=1
  fi
}

run_target gguf 16384
run_target safetensors 8192
exit $status
