#!/bin/bash
# Copies test_cuda, test_engine and bonsai (from $BUILD, default build-cuda) plus the shared libraries the device
# image lacks into $DEVBIN (default .devbin/; ignored through .git/info/exclude), for `run` with carry [".devbin"]
# (or [$DEVBIN]; the device scripts use the binaries beside them). BASELINE: below.
set -eu
cd "$(dirname "$0")/../.."
D=${DEVBIN:-.devbin}
case "$D" in .devbin*) ;; *) echo "DEVBIN must be a top-level .devbin* folder, not $D" >&2; exit 1 ;; esac
ex=$(git rev-parse --git-common-dir)/info/exclude; grep -qxF "/.devbin*/" "$ex" || echo "/.devbin*/" >> "$ex"
rm -rf "$D"
mkdir -p "$D"
BUILD=${BUILD:-build-cuda}
cp $BUILD/tests/test_cuda $BUILD/tests/test_engine $BUILD/bonsai "$D"/
strip "$D"/test_cuda "$D"/test_engine "$D"/bonsai
# BASELINE=<a bonsai binary of an earlier round>: staged as .devbin/bonsai_r5 for same-run comparisons
# (device_round6.sh: configs named r5*); it must need no library the others do not.
if [ -n "${BASELINE:-}" ]; then cp "$BASELINE" "$D"/bonsai_r5; strip "$D"/bonsai_r5; fi
for lib in $(ldd $BUILD/tests/test_cuda $BUILD/tests/test_engine $BUILD/bonsai | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;  # the device's own glibc
    *) cp -L "$lib" "$D"/ ;;
  esac
done
# TRACE_BUILD=<build dir configured with -DCMAKE_CUDA_FLAGS=-DBONSAI_V7_TRACE> (round 24): its bonsai staged as
# bonsai_trace, for device_round21.sh TRACE=1 (the v7 timeline of a decode step), with the report script.
if [ -n "${TRACE_BUILD:-}" ]; then
  cp "$TRACE_BUILD"/bonsai "$D"/bonsai_trace; strip "$D"/bonsai_trace; cp tests/cuda/v7_trace_report.py "$D"/
fi
cp tests/cuda/device_*.sh "$D"/
# STAGE_GZ=1: the binaries gzipped (device_env.sh unpacks them), for a carry near the 64 MiB limit (a baseline binary).
if [ "${STAGE_GZ:-0}" = 1 ]; then for f in test_cuda test_engine bonsai bonsai_r5 bonsai_trace; do [ -e "$D/$f" ] && gzip -9 "$D/$f"; done; fi
du -sh "$D"
ls "$D"
