#!/usr/bin/env bash
# On the GPU machine, from the repository root: questions about the prompt
# path that one A/B run does not answer (QWASI_BIN: a `--features cuda` build,
# QWASI_BIN_BASE: a base build).
#   1. numerics: the prompt logits of the two builds with the token-serial
#      delta rule (QWASI_GDN=serial), which neither build changed, and the base
#      build's chunked against its serial delta rule at 512 tokens after 13
#      decode steps (how far the synthetic model carries a rounding change);
#   2. QWASI_MOE_STAGES=3 against the default at $PROFILE_LEN (per-kernel times);
#   3. where ncu exists: stall reasons of one gdn_chunk_state and one
#      moe_gemm_split128 launch (8 layers, 8K tokens).
# Everything lands in $OUT/probe.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
R=/tmp/qwasi-probe
rm -rf $R && mkdir -p $R $OUT
NEW=${QWASI_BIN:-target/release/qwasi}
OLD=${QWASI_BIN_BASE:?a base build}
PROFILE_LEN=${PROFILE_LEN:-8192}
one() {  # name, binary, env..., then bench flags after --
  local n=$1 b=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 120 $b bench --workload speed --backend cuda --runs 1 --warmups 0 --fixtures /nonexistent \
    --dump-logits $R/logits-$n --out $R/$n.json "$@" > $R/$n.log 2>&1
}
echo "== numerics"
one new-serial $NEW QWASI_GDN=serial -- --lens 512 --decode-tokens 13
one old-serial $OLD QWASI_GDN=serial -- --lens 512 --decode-tokens 13
one old-chunked $OLD X=1 -- --lens 512 --decode-tokens 13
for p in "new-serial old-serial" "old-chunked old-serial"; do
  set -- $p
  echo "$1 vs $2:"; python3 scripts/device/logits_compare.py $R/logits-$1 $R/logits-$2 > $R/compare-$1-$2.json
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(' ', k, v) for k, v in d['files'].items()]" $R/compare-$1-$2.json
done
echo "== QWASI_MOE_STAGES"
for st in 2 3; do
  one profile-s$st $NEW QWASI_GPU_PROFILE=1 QWASI_MOE_STAGES=$st -- --lens $PROFILE_LEN --decode-tokens 4
  python3 - $R/profile-s$st.json $st <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
ms = {k["kernel"]: k["ms"] for k in r["prefill_profile_ms"]}
print(f"  stages {sys.argv[2]}: TTFT {r['ttft_ms']['median']:.1f} ms;", ", ".join(f"{k} {v:.1f}" for k, v in ms.items() if k.startswith("moe_gemm")))
PY
done
if command -v ncu >/dev/null; then
  echo "== ncu"
  for k in gdn_chunk_state moe_gemm_split128; do
    timeout 200 ncu --kernel-name $k --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      $NEW bench --workload speed --backend cuda --layers 8 --lens 8192 --decode-tokens 2 --runs 1 --warmups 0 \
      --fixtures /nonexistent --out $R/ncu-run.json > $R/ncu-$k.txt 2>&1
    grep -E "Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Stall|Issued Warp|No Eligible|Eligible Warps|Registers|Block Limit" $R/ncu-$k.txt | head -40
  done
else
  echo "no ncu"; ls /usr/local/cuda*/bin 2>/dev/null | head
fi
tar czf $OUT/probe.tgz -C /tmp qwasi-probe
