#!/usr/bin/env bash
# Compile-time check of how ptxas scheduled the warpgroup-MMA kernels (no GPU
# needed; nvcc from the nvcc wheel): no kernel has its wgmma serialized
# (ptxas warnings C7514 / C7518 under -Xptxas -v: a wait after every
# product, which a wgmma issued and waited for in different branches causes;
# kernels/attention_wg.cu explains how its loop avoids it).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:?set NVCC (scripts/check-gpu-build.sh does)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for f in attention_wg moe_gemm; do
  "$NVCC" --cubin -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xptxas -v -Ikernels \
    -o "$tmp/$f.cubin" "kernels/$f.cu" 2>"$tmp/$f.log"
  if grep -E "C7514|C7518" "$tmp/$f.log"; then
    echo "sass: kernels/$f.cu: ptxas serialized wgmma (see above)" >&2
    fail=1
  fi
done
[ $fail = 0 ] && echo "sass: no serialized wgmma in attention_wg.cu, moe_gemm.cu"
exit $fail
