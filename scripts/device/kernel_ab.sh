#!/usr/bin/env bash
# On the GPU machine, from the repository root: the decode-step kernel forms
# that are off by default until measured, each against the default in one
# call, with its own correctness check first (PERFORMANCE-BATCHED.md).
#   1. per variant, `qwasi verify --backend cuda` with its settings (the
#      fixtures, each batched against alone): a variant that fails is not
#      timed;
#   2. per variant, `qwasi bench --workload batch` (synthetic 40-layer
#      weights, 1K prompts) at $BATCHES, the default first and again last
#      (the lease's drift);
#   3. batch 1: `qwasi bench --workload speed` at 512 and 8K for the default
#      and each variant of $SPEED_VARIANTS that passed, alternating for two
#      rounds (none without SPEED_VARIANTS).
# Variants ($VARIANTS, required, space-separated; several variables of one
# joined by commas, e.g. "QWASI_GEMM_ROWS=bulk8 QWASI_MOE_PLAN=kernels"): the
# settings (docs/GPU.md "Options") to time against the default.
# Files are named by variant with '=' and ',' as '_'.
# Output: $OUT/kernel-ab.json (each variant's verify result and batch rows,
# the batch-1 runs) and $OUT/kernel-ab-logs.tgz (every log and report).
# Env: QWASI_BIN (.dev/qwasi), BATCHES (8,12,16,64), VARIANTS,
# SPEED_VARIANTS, LOGS (/tmp/kernel-ab-logs; under $OUT, the logs come back
# even when the call runs out of time).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
LOGS=${LOGS:-/tmp/kernel-ab-logs}
rm -rf "$LOGS"
mkdir -p "$LOGS" "$OUT"
BIN=$(readlink -f "${QWASI_BIN:-.dev/qwasi}")
BATCHES=${BATCHES:-8,12,16,64}
VARIANTS=${VARIANTS:?set VARIANTS: the settings to time against the default}
SYN="--backend cuda --synthetic qwen3.6-35b-a3b --layers 40 --fixtures /nonexistent"
rc=0
# The settings of variant $1 as env arguments ("default": none).
settings() { [ "$1" = default ] || echo "${1//,/ }"; }
# Variant $1 as a file name.
slug() { echo "$1" | tr '=,' '__'; }
passed=(default)
"$BIN" verify --backend cuda > "$LOGS/verify-default.log" 2>&1 || { rc=1; passed=(); }
echo "verify default: $(tail -1 "$LOGS/verify-default.log")"
for v in $VARIANTS; do
  if env $(settings "$v") "$BIN" verify --backend cuda > "$LOGS/verify-$(slug "$v").log" 2>&1; then
    passed+=("$v")
  else
    rc=1
  fi
  echo "verify $v: $(tail -1 "$LOGS/verify-$(slug "$v").log")"
done
for v in "${passed[@]}" default; do
  name=$(slug "$v")
  [ -e "$LOGS/batch-$name.json" ] && name=$name-again
  env $(settings "$v") "$BIN" bench --workload batch $SYN --lens 1024 --decode-tokens 16 --batches "$BATCHES" \
    --out "$LOGS/batch-$name.json" > "$LOGS/batch-$name.log" 2>&1 || rc=1
  echo "batch $name: $(grep -E '^\[bench\] [0-9]+ prompt' "$LOGS/batch-$name.log" | tr '\n' ' ' | cut -c1-300)"
done
if [ -n "${SPEED_VARIANTS:-}" ]; then
  for round in 1 2; do
    for v in default $SPEED_VARIANTS; do
      [[ " ${passed[*]} " == *" $v "* ]] || continue
      f="$LOGS/speed-$(slug "$v")-r$round"
      env $(settings "$v") "$BIN" bench --workload speed $SYN --lens 512,8192 --decode-tokens 128 --runs 3 \
        --warmups 1 --out "$f.json" > "$f.log" 2>&1 || rc=1
      echo "speed $v round $round: $(grep -E 'tok/s' "$f.log" | tail -2 | tr '\n' ' ' | cut -c1-300)"
    done
  done
fi
python3 - "$OUT/kernel-ab.json" "$LOGS" <<'EOF'
import glob, json, os, sys
out, logs = sys.argv[1], sys.argv[2]
report = {"verify": {}, "batch": {}, "speed": {}}
for p in sorted(glob.glob(f"{logs}/verify-*.log")):
    lines = open(p).read().strip().splitlines()
    report["verify"][os.path.basename(p)[7:-4]] = lines[-1] if lines else ""
for p in sorted(glob.glob(f"{logs}/batch-*.json")):
    d = json.load(open(p))
    report["batch"][os.path.basename(p)[6:-5]] = [
        {k: r[k] for k in ("batch", "aggregate_tok_per_s", "step_ms_p50", "step_ms_p99")} for r in d["results"]]
for p in sorted(glob.glob(f"{logs}/speed-*.json")):
    d = json.load(open(p))
    report["speed"][os.path.basename(p)[6:-5]] = [
        {"prompt_len": r["prompt_len"], "decode_tok_per_s": r["decode_tok_per_s"]["median"],
         "ttft_ms": r["ttft_ms"]["median"]} for r in d["results"]]
json.dump(report, open(out, "w"), indent=1)
base = {r["batch"]: r["aggregate_tok_per_s"] for r in report["batch"].get("default", [])}
for name, rows in report["batch"].items():
    print(f"{name:44s}", "  ".join(
        f"B={r['batch']}: {r['aggregate_tok_per_s']:.0f}"
        + (f" ({100 * (r['aggregate_tok_per_s'] / base[r['batch']] - 1):+.1f}%)" if r["batch"] in base else "")
        for r in rows))
EOF
tar czf "$OUT/kernel-ab-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
exit $rc
