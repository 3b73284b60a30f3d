#!/usr/bin/env bash
# On the GPU machine, from the repository root: the warpgroup-MMA prompt
# attention (attn_flash_wg_*, the default on 9.x) against the mma.sync one
# (QWASI_ATTN=mma) of the same binary (QWASI_BIN).
#   1. correctness with QWASI_ATTN=wg: `verify --synthetic` (the reference
#      fixtures against transformers: their head dim 32 runs
#      attn_flash_wg_f32_d32; then the 40-layer synthetic model's prefill vs
#      decode agreement);
#   2. compute-sanitizer memcheck and synccheck of the attention kernels
#      (only they are instrumented; SANITIZE=0 skips it);
#   3. per-kernel prompt times at $PROFILE_LENS (QWASI_GPU_PROFILE=1) and the last
#      logits of each length, both kernels; logits_compare.py between them;
#      the same at 8K with the bf16 cache (QWASI_KV=bf16);
#   4. QWASI_ATTN=wg: the 131,072-token TTFT (1 + 2 runs) and the prefix
#      cache's 131K cached + 1K new tokens (scripts/device/prefix_cache.sh).
# STEPS picks them: check (1, 2), profile (3), long (4); default "check profile"
# (about 6 minutes), then STEPS=long in a second call (about 3 minutes).
# Everything lands in $OUT/attn-wg.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
R=$OUT/attn-wg
mkdir -p $R
B=${QWASI_BIN:-target/release/qwasi}
PROFILE_LENS=${PROFILE_LENS:-8192,32768}
STEPS=${STEPS:-check profile}
step() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
if step check; then
echo "== verify --synthetic"
QWASI_ATTN=wg timeout 240 $B verify --backend cuda --synthetic qwen3.6-35b-a3b --json $R/verify.json > $R/verify.log 2>&1
echo "verify exit $?"; grep -E "PASS|FAIL" $R/verify.log | cut -c1-140
if [ "${SANITIZE:-1}" = 1 ]; then
  # The attention kernels only (kernel-name substring): memcheck over the
  # fixtures (head dim 32) and 4 synthetic layers (256, one attention layer,
  # and the verify attention check), synccheck over the fixtures.
  echo "== compute-sanitizer memcheck (attn_*)"
  QWASI_ATTN=wg timeout 200 compute-sanitizer --tool memcheck --kernel-name kns=attn_ --print-limit 20 \
    $B verify --backend cuda --synthetic qwen3.6-35b-a3b --layers 4 --gen-tokens 2 > $R/sanitize-memcheck.log 2>&1
  echo "exit $?"; grep -E "ERROR SUMMARY|Invalid|verify:" $R/sanitize-memcheck.log | head -5
  # racecheck is not usable here: compute-sanitizer 2025.3.1 on the H200
  # stops with "Internal Sanitizer Error: failed to handle a hardware
  # exception" in the first cuBLAS call, whatever kernel it is filtered to.
  echo "== compute-sanitizer synccheck (attn_flash_wg, fixtures)"
  QWASI_ATTN=wg timeout 150 compute-sanitizer --tool synccheck --kernel-name kns=attn_flash_wg --print-limit 20 \
    $B verify --backend cuda > $R/sanitize-synccheck.log 2>&1
  echo "exit $?"; grep -E "ERROR SUMMARY|verify:" $R/sanitize-synccheck.log | head -5
fi
fi
if step profile; then
for a in wg mma; do
  echo "== profile $a at $PROFILE_LENS"
  QWASI_ATTN=$a QWASI_GPU_PROFILE=1 timeout 200 $B bench --workload speed --backend cuda --lens $PROFILE_LENS \
    --decode-tokens 4 --runs 1 --warmups 0 --ttft-max 131072 --fixtures /nonexistent --dump-logits $R/logits-$a \
    --out $R/profile-$a.json > $R/profile-$a.log 2>&1
  python3 - $R/profile-$a.json $a <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    ms = {k["kernel"]: k["ms"] for k in r["prefill_profile_ms"]}
    att = {k: v for k, v in ms.items() if k.startswith("attn")}
    print(f"  {sys.argv[2]} L {r['prompt_len']}: ttft {r['ttft_ms']['median']:.1f} ms, kernels {sum(ms.values()):.1f} ms;",
          ", ".join(f"{k} {v:.1f}" for k, v in sorted(att.items(), key=lambda kv: -kv[1])))
PY
done
python3 scripts/device/logits_compare.py $R/logits-wg $R/logits-mma > $R/logits-compare.json
python3 -c "import json; d=json.load(open('$R/logits-compare.json')); [print(' ', k, v) for k, v in d['files'].items()]"
# The bf16 cache (attn_flash_wg_bf16_d256): its logits against mma.sync's on the same cache.
for a in wg mma; do
  QWASI_KV=bf16 QWASI_ATTN=$a QWASI_GPU_PROFILE=1 timeout 100 $B bench --workload speed --backend cuda --lens 8192 \
    --decode-tokens 4 --runs 1 --warmups 0 --fixtures /nonexistent --dump-logits $R/logits-bf16-$a \
    --out $R/profile-bf16-$a.json > $R/profile-bf16-$a.log 2>&1
  grep -E "\] L " $R/profile-bf16-$a.log | cut -c1-120
done
python3 scripts/device/logits_compare.py $R/logits-bf16-wg $R/logits-bf16-mma > $R/logits-compare-bf16.json
python3 -c "import json; d=json.load(open('$R/logits-compare-bf16.json')); [print('  bf16', k, v) for k, v in d['files'].items()]"
fi
if step long; then
  echo "== 131K TTFT (wg)"
  QWASI_ATTN=wg timeout 150 $B bench --workload speed --backend cuda --lens 131072 --ttft-max 131072 --decode-tokens 8 \
    --runs 2 --warmups 1 --fixtures /nonexistent --out $R/speed-131k-wg.json > $R/speed-131k-wg.log 2>&1
  grep -E "\] L " $R/speed-131k-wg.log | cut -c1-140
  echo "== prefix cache 131K + 1K (wg)"
  QWASI_ATTN=wg OUT=$R/pc QWASI_BIN=$B PREFIXES=8192,131072 timeout 240 scripts/device/prefix_cache.sh > $R/pc.log 2>&1
  grep -E "cached|exit" $R/pc.log | tail -4
fi
