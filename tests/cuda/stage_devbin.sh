#!/bin/bash
# Copies test_cuda, test_engine and bonsai (from $BUILD, default build-cuda) plus the shared libraries the device
# image lacks into .devbin/ (ignored through .git/info/exclude), for `run` with carry [".devbin"].
set -eu
cd "$(dirname "$0")/../.."
ex=$(git rev-parse --git-common-dir)/info/exclude; grep -qx "/.devbin/" "$ex" || echo "/.devbin/" >> "$ex"
rm -rf .devbin
mkdir -p .devbin
BUILD=${BUILD:-build-cuda}
cp $BUILD/tests/test_cuda $BUILD/tests/test_engine $BUILD/bonsai .devbin/
strip .devbin/test_cuda .devbin/test_engine .devbin/bonsai
for lib in $(ldd $BUILD/tests/test_cuda $BUILD/tests/test_engine $BUILD/bonsai | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;  # the device's own glibc
    *) cp -L "$lib" .devbin/ ;;
  esac
done
cp tests/cuda/device_*.sh .devbin/
du -sh .devbin
ls .devbin
