#!/usr/bin/env bash
# On the GPU machine, from the repository root: where the prompt attention
# kernels spend their time (ncu on one launch of each at $LEN tokens, 4 layers
# of the synthetic model: its one attention layer), and the prefix cache's
# 131K cached + 1K new tokens with the bf16 KV cache (KV_BF16_PC=1).
# QWASI_BIN as in bench.sh; everything in $OUT/attn-probe.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
R=/tmp/attn-probe
rm -rf $R; mkdir -p $R
B=${QWASI_BIN:-target/release/qwasi}
LEN=${LEN:-8192}
KERNELS=${KERNELS:-attn_flash_wg_f32_d256 attn_flash_tc_f32_d256 attn_flash_wg_bf16_d256}
for k in $KERNELS; do
  kv=f32; [[ $k == *bf16* ]] && kv=bf16
  attn=wg; [[ $k == attn_flash_tc* ]] && attn=mma
  echo "== ncu $k ($LEN tokens)"
  QWASI_KV=$kv QWASI_ATTN=$attn timeout 200 ncu --kernel-name $k --launch-count 1 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__inst_executed.sum \
    $B bench --workload speed --backend cuda --layers 4 --lens $LEN --decode-tokens 2 --runs 1 --warmups 0 \
    --fixtures /nonexistent --out $R/ncu-run.json > $R/ncu-$k.txt 2>&1
  grep -E "Duration|Throughput|gmma|Stall|Issued Warp|No Eligible|Eligible Warps|Registers|Shared Memory|Warp Cycles" $R/ncu-$k.txt | head -40
done
if [ "${KV_BF16_PC:-1}" = 1 ]; then
  echo "== prefix cache 131K + 1K, bf16 KV"
  QWASI_KV=bf16 OUT=$R/pc-bf16 QWASI_BIN=$B PREFIXES=131072 timeout 150 scripts/device/prefix_cache.sh > $R/pc-bf16.log 2>&1
  grep -E "cached|exit" $R/pc-bf16.log | head -3
fi
tar czf $OUT/attn-probe.tgz -C /tmp attn-probe
