#!/bin/bash
# Copies test_cuda, test_engine and bonsai (from build-cuda) plus the shared libraries the device image lacks into
# .devbin/ (ignored through .git/info/exclude), for `run` with carry [".devbin"].
set -eu
cd "$(dirname "$0")/../.."
ex=$(git rev-parse --git-common-dir)/info/exclude; grep -qx "/.devbin/" "$ex" || echo "/.devbin/" >> "$ex"
rm -rf .devbin
mkdir -p .devbin
cp build-cuda/tests/test_cuda build-cuda/tests/test_engine build-cuda/bonsai .devbin/
strip .devbin/test_cuda .devbin/test_engine .devbin/bonsai
for lib in $(ldd build-cuda/tests/test_cuda build-cuda/tests/test_engine build-cuda/bonsai | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;  # the device's own glibc
    *) cp -L "$lib" .devbin/ ;;
  esac
done
cp tests/cuda/device_run.sh tests/cuda/device_gate_bench.sh tests/cuda/device_ncu.sh tests/cuda/device_gemm2.sh .devbin/
du -sh .devbin
ls .devbin
