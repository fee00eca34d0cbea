#!/bin/bash
# Round 15's device runs (docs/cuda-kernels.md, round 15): device_round14.sh, whose TEST2 option round 15 added
# (TEST2="ENV=V,ENV=V|gtest filter": test_cuda once more under that environment). Same variables, same carry.
exec bash "$(dirname "$0")/device_round14.sh" "$@"
