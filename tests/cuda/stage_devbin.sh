#!/bin/bash
# Copies test_cuda, test_engine and bonsai (from $BUILD, default build-cuda) plus the shared libraries the device
# image lacks into .devbin/ (ignored through .git/info/exclude), for `run` with carry [".devbin"]. BASELINE: below.
set -eu
cd "$(dirname "$0")/../.."
ex=$(git rev-parse --git-common-dir)/info/exclude; grep -qx "/.devbin/" "$ex" || echo "/.devbin/" >> "$ex"
rm -rf .devbin
mkdir -p .devbin
BUILD=${BUILD:-build-cuda}
cp $BUILD/tests/test_cuda $BUILD/tests/test_engine $BUILD/bonsai .devbin/
strip .devbin/test_cuda .devbin/test_engine .devbin/bonsai
# BASELINE=<a bonsai binary of an earlier round>: staged as .devbin/bonsai_r5 for same-run comparisons
# (device_round6.sh: configs named r5*); it must need no library the others do not.
if [ -n "${BASELINE:-}" ]; then cp "$BASELINE" .devbin/bonsai_r5; strip .devbin/bonsai_r5; fi
for lib in $(ldd $BUILD/tests/test_cuda $BUILD/tests/test_engine $BUILD/bonsai | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;  # the device's own glibc
    *) cp -L "$lib" .devbin/ ;;
  esac
done
cp tests/cuda/device_*.sh .devbin/
du -sh .devbin
ls .devbin
