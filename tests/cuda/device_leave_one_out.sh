#!/bin/bash
# What each kernel family costs ON the graph-mode decode chain (leave-one-out): `bonsai bench --backend cuda -p 0 -n 64
# -r 2` on the 27b-shape pack with BONSAI_CUDA_SKIP=<prefixes> (those kernels not launched: timing only, the tokens are
# garbage), one line per SKIPS entry "name:prefix,prefix" ("base:" = nothing skipped, run first and last to bracket the
# drift). Eager per-kernel times (BONSAI_CUDA_PROFILE) overstate a kernel's cost: PDL overlaps each kernel's start with
# its predecessor. First the eager launch order of one step (PROFILE=2) for the kernel names.
# Binaries: DEVBIN=.devbin-me BUILD=build-cuda tests/cuda/stage_devbin.sh; run `bash .devbin-me/device_leave_one_out.sh`
# with carry [".devbin-me"]. $OUT: order.txt, loo.txt. DEPTHS: the -d list (default 0).
set -u
source "$(dirname "$0")/device_env.sh"
device_header
if [ ! -f "$P27" ]; then start_27b_pack; wait $MP; fi
BONSAI_CUDA_PROFILE=2 BONSAI_CUDA_GRAPHS=0 timeout 100 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 4 -r 1 > "$OUT/order.txt" 2>&1
echo "order rc=$?"; head -30 "$OUT/order.txt" | grep -E "kernel|_kernel" | head -24
SKIPS=${SKIPS:-"base: site:site_kernel cluster:site_kernel_cluster delta:delta_kernel conv:conv_dense_kernel attn:attn,attention matvec6:matvec6 v3:matvec_kernel small:site_kernel,delta_kernel,conv_dense_kernel,attn,attention matvecs:matvec6,matvec_kernel base:"}
for cfg in $SKIPS; do
  name=${cfg%%:*}; skip=${cfg#*:}
  line=$(BONSAI_CUDA_SKIP="$skip" timeout 100 $B/bonsai bench --backend cuda -m "$P27" -p 0 -n 64 -r 2 -d ${DEPTHS:-0} 2>/dev/null | grep -E "^tg|tg64" | tr '\n' ' ')
  echo "$name [$skip] $line" | tee -a "$OUT/loo.txt"
done
