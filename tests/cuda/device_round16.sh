#!/bin/bash
# Round 16's device runs (docs/cuda-kernels.md, round 16): device_round14.sh with its TEST2 (round 15) and KT_ENVS
# (round 16: the kernel table once per environment) options. Same variables, same carry.
exec bash "$(dirname "$0")/device_round14.sh" "$@"
