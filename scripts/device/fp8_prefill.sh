#!/usr/bin/env bash
# On the GPU machine, from the repository root: `--prefill-precision fp8`
# (issue 28; docs/FP8.md "FP8 activations"), correctness and speed of one
# binary (QWASI_BIN, default .dev/qwasi):
#   1. `qwasi verify --backend cuda`: the fixtures in the default mode, and
#      on the FP8 fixture the FP8-activation projection and expert kernel
#      against the f64 products of their quantized operands;
#   2. with COMPARE=1: scripts/device/compare_transformers.py --fp8 --dtype
#      both (a full-width block-FP8 model of $LAYERS layers, transformers in
#      f32 and bf16 on its dequantized weights, prompts of $LENS tokens),
#      then `verify --compare` in each of $MODES;
#   3. `qwasi bench --workload speed` on the synthetic 40-layer FP8 model at
#      $SPEED_LENS in each of $MODES; with PROFILE=1 the per-kernel prompt
#      profile at 8K in each.
# Output: $OUT/verify.json, compare-<mode>.json, speed-<mode>.json,
# profile-<mode>.json and logs.tgz.
# Env: MODES (split bf16 fp8), LAYERS (8), LENS (1024,8192), SPEED_LENS
# (512,8192), RUNS (3), COMPARE (1), PROFILE (1), REF_DIR (/dev/shm/qwasi-ref-fp8).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT" /tmp/fp8logs
BIN=$(readlink -f "${QWASI_BIN:-.dev/qwasi}")
MODES=${MODES:-split bf16 fp8}
REF=${REF_DIR:-/dev/shm/qwasi-ref-fp8}
SYN="--backend cuda --synthetic qwen3.6-35b-a3b-fp8"
L=/tmp/fp8logs
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
"$BIN" verify --backend cuda --json "$OUT/verify.json" > $L/verify.log 2>&1 || rc=1
grep -E "FP8|^(PASS|FAIL)" $L/verify.log | tail -4
echo "verify: $(tail -1 $L/verify.log)"
if [ "${COMPARE:-1}" = 1 ]; then
  if [ ! -e "$REF/ref.json" ]; then
    PYTHONUNBUFFERED=1 python3 scripts/device/compare_transformers.py "$REF" --fp8 --dtype both \
      --layers "${LAYERS:-8}" --lens "${LENS:-1024,8192}" --gen 16 > $L/ref.log 2>&1 || { rc=1; tail -5 $L/ref.log; }
  fi
  for m in $MODES; do
    "$BIN" verify --backend cuda --compare "$REF" --prefill-precision "$m" --json "$OUT/compare-$m.json" \
      > $L/compare-$m.log 2>&1 || rc=1
    echo "== compare $m"; grep -iE "KL|len|PASS|FAIL" $L/compare-$m.log | tail -6
  done
fi
for m in $MODES; do
  "$BIN" bench --workload speed $SYN --prefill-precision "$m" --lens "${SPEED_LENS:-512,8192}" \
    --decode-tokens 32 --runs "${RUNS:-3}" --warmups 1 --out "$OUT/speed-$m.json" > $L/speed-$m.log 2>&1 || rc=1
  echo "== speed $m"; grep -iE "TTFT|tok/s|error" $L/speed-$m.log | tail -4
  if [ "${PROFILE:-1}" = 1 ]; then
    QWASI_GPU_PROFILE=1 "$BIN" bench --workload speed $SYN --prefill-precision "$m" --lens 8192 \
      --decode-tokens 4 --runs 1 --warmups 1 --fixtures /nonexistent --out "$OUT/profile-$m.json" > $L/profile-$m.log 2>&1 || rc=1
    python3 -c "
import json,sys; r=json.load(open(sys.argv[1]))['results'][0]
print('  8K TTFT (profiled)', r['ttft_ms']['median'])
for p in r['prefill_profile_ms'][:8]: print('   %-30s %5d %8.2f ms' % (p['kernel'], p['launches'], p['ms']))" "$OUT/profile-$m.json"
  fi
done
tar czf "$OUT/logs.tgz" -C $L .
exit $rc
