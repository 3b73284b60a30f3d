#!/usr/bin/env bash
# Compile-time checks of how ptxas scheduled the warpgroup-MMA kernels (no GPU
# needed; nvcc and nvdisasm from the nvcc wheel):
#   - no kernel has its wgmma serialized (ptxas warnings C7514 / C7518 under
#     -Xptxas -v: a wait after every product);
#   - in the prompt attention kernels' tile loop, the softmax of the next tile
#     (at least 16 MUFU.EX2) sits between the wait for S (wait_group 1) and
#     the wait for P V (wait_group 0), so it runs while P V does. ptxas hoisted
#     that wait above the softmax until `cp_async_after` (kernels/mma.h) tied
#     it down; an edit that undoes this fails here instead of only costing time.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:?set NVCC (scripts/check-gpu-build.sh does)}
NVDISASM=$(dirname "$NVCC")/nvdisasm
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
"$NVDISASM" "$tmp/attention_wg.cubin" >"$tmp/attention_wg.sass"
for k in attn_flash_wg_f32_d256 attn_flash_wg_bf16_d256; do
  # EX2 count between the first wait_group 1 and the wait_group 0 after it.
  n=$(awk -v k="$k" '
    $0 ~ "^" k ":" { on = 1; next }
    on && /\.size/ { exit }
    on && /WARPGROUP.DEPBAR.LE gsb0, 0x1/ && !seen { seen = 1; next }
    on && seen && /WARPGROUP.DEPBAR.LE gsb0, 0x0/ { print ex + 0; found = 1; exit }
    on && seen && /MUFU.EX2/ { ex++ }
    END { if (!found) print -1 }' "$tmp/attention_wg.sass")
  if [ "$n" -ge 16 ]; then
    echo "sass: $k: $n exp2 between the waits for S and for P V (softmax under P V)"
  else
    echo "sass: $k: $n exp2 between the waits for S and for P V: the softmax no longer runs under P V" >&2
    fail=1
  fi
done
exit $fail
