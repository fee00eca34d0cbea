#!/usr/bin/env bash
# Installs dependencies, builds, runs every test (ctest), then the bounded fuzz runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)")
if [ -f scripts/fuzz.sh ]; then bash scripts/fuzz.sh "${BONSAI_FUZZ_SECONDS:-60}"; fi
