#!/usr/bin/env bash
# The main job on the embedded default: install, build, write the tiny pack (all formats), inspect it,
# and generate from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
./build/bonsai make-pack --preset tiny --seed 7 -o packs
./build/bonsai inspect packs/tiny-pq2_0.gguf
if ./build/bonsai run --help >/dev/null 2>&1; then
  ./build/bonsai run -m packs/tiny-pq2_0.gguf -p "The capital of France is" -n 32
fi
