#!/usr/bin/env bash
# On the GPU machine, from the repository root: the batched decode step
# (issue 23), engine alone, with the correctness checks of the same binary.
#   1. `qwasi verify --backend cuda` (fixtures against transformers, each
#      batched against alone) and `--synthetic` at 40 layers (the batched
#      check at full geometry);
#   2. `qwasi bench --workload batch` at $BATCHES (1K prompts), $OUT/batch.json;
#   3. A/B at $AB_BATCHES: each switch of $AB (VAR=value, space-separated;
#      several variables of one switch joined by commas) against the
#      default, one JSON per run merged into $OUT/batch-ab.json;
#   4. with PROFILE=1: per-kernel times at $PROFILE_BATCHES, $OUT/profile.json;
#   5. with SOAK=1: scripts/soak on the GPU backend (demo model) under memory
#      pressure (--kv-cache-mib $SOAK_KV_MIB, default 17: two demo-model
#      sequences of one 2 MB KV page a buffer fit; --max-tokens 4500, so
#      some cross 4,032 tokens and grow a page; --expect-preemptions),
#      $OUT/soak-<entry>.json. With QWASI_KV_PAGES=0 in SOAK_ENVS (slabs of
#      8.5 MiB with 4,096 rows of headroom) 300-token requests already
#      preempt: SOAK_MAX_TOKENS=300 makes that run shorter.
# Env: QWASI_BIN (.dev/qwasi), BATCHES (1,8,16,32,64), AB_BATCHES (8,64),
#      AB ("QWASI_MOE_PLAN=fused QWASI_GEMM_STACK=off"), SOAK_S (90), SOAK_EXTRA,
#      SOAK_ENVS, SOAK_KV_MIB, SOAK_MAX_TOKENS.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=$(readlink -f "${QWASI_BIN:-.dev/qwasi}")
SYN="--backend cuda --synthetic qwen3.6-35b-a3b --layers 40 --lens 1024 --decode-tokens 16 --fixtures /nonexistent"
rc=0
"$BIN" verify --backend cuda --json "$OUT/verify.json" > /tmp/verify.log 2>&1 || rc=1
echo "verify: $(tail -1 /tmp/verify.log)"
"$BIN" verify --backend cuda --synthetic qwen3.6-35b-a3b --layers 40 --json "$OUT/verify-synthetic.json" \
  > /tmp/verify-syn.log 2>&1 || rc=1
echo "verify --synthetic: $(tail -1 /tmp/verify-syn.log)"
echo "== batch at ${BATCHES:-1,8,16,32,64}"
"$BIN" bench --workload batch $SYN --batches "${BATCHES:-1,8,16,32,64}" --out "$OUT/batch.json" 2>&1 \
  | grep -E "^\[bench\] [0-9]+ prompt" || rc=1
mkdir -p /tmp/ab
for sw in default ${AB:-QWASI_MOE_PLAN=fused QWASI_GEMM_STACK=off}; do
  if [ "$sw" = default ]; then envs=(); else envs=(${sw//,/ }); fi
  env "${envs[@]}" "$BIN" bench --workload batch $SYN --batches "${AB_BATCHES:-8,64}" \
    --out "/tmp/ab/$sw.json" > "/tmp/ab/$sw.log" 2>&1 || rc=1
done
python3 - "$OUT/batch-ab.json" /tmp/ab/*.json <<'EOF'
import json, sys, os
runs = {}
for p in sys.argv[2:]:
    d = json.load(open(p))
    runs[os.path.basename(p)[:-5]] = [{k: r[k] for k in ("batch", "aggregate_tok_per_s", "step_ms_p50", "step_ms_p99")}
                                       for r in d["results"]]
json.dump(runs, open(sys.argv[1], "w"), indent=1)
for k, v in runs.items():
    print(f"{k:28s}", "  ".join(f"B={r['batch']}: {r['aggregate_tok_per_s']:.0f} tok/s" for r in v))
EOF
if [ "${PROFILE:-1}" = 1 ]; then
  QWASI_GPU_PROFILE=1 "$BIN" bench --workload batch $SYN --batches "${PROFILE_BATCHES:-8,64}" \
    --out "$OUT/profile.json" > /tmp/profile.log 2>&1 || rc=1
  python3 - "$OUT/profile.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"B={r['batch']} step {r['step_ms_p50']:.2f} ms (profiled, serialised)")
    for p in r.get("profile", [])[:12]:
        print(f"   {p['kernel']:28s} {p['launches_per_step']:6.1f} {p['ms_per_step']:7.3f} ms")
EOF
fi
if [ "${SOAK:-0}" = 1 ]; then
  # SOAK_ENVS: one soak per entry (VAR=value, or "default"), $OUT/soak-<entry>.json.
  for sw in ${SOAK_ENVS:-default}; do
    if [ "$sw" = default ]; then envs=(); else envs=("$sw"); fi
    echo "== GPU soak ($sw), ${SOAK_S:-90} s, --kv-cache-mib ${SOAK_KV_MIB:-17}"
    env "${envs[@]}" python3 scripts/soak --bin "$BIN" --duration "${SOAK_S:-90}" --report "$OUT/soak-$sw.json" \
      --serve-arg=--backend --serve-arg=cuda --serve-arg=--kv-cache-mib --serve-arg="${SOAK_KV_MIB:-17}" \
      --max-tokens "${SOAK_MAX_TOKENS:-4500}" --expect-preemptions ${SOAK_EXTRA:-} > /tmp/soak.log 2>&1 || rc=1
    grep -E "soak FAILED|RSS:|^  [a-z\"]" /tmp/soak.log | grep -v "^  \"qwasi_guest" | tail -8
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); m=d['metrics_after']; print('outcomes', d['outcomes']); print('preemptions', m.get('qwasi_preemptions_total'), 'failed', m.get('qwasi_requests_finished_total{reason=\"failed\"}'))" "$OUT/soak-$sw.json"
  done
fi
exit $rc
