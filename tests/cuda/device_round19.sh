#!/bin/bash
# Round 19's device run: device_round21.sh runs it with the same options (round 21 added only PROF), so round 19's and
# round 20's recorded commands (docs/cuda-kernels.md) still work through this name.
exec bash "$(dirname "${BASH_SOURCE[0]}")/device_round21.sh" "$@"
