#!/usr/bin/env bash
# On the GPU machine, from the repository root: the paged KV cache (the
# default on CUDA; QWASI_KV_PAGES=1 is set here, docs/GPU.md "Sequences and
# the prefix cache") checked, and against slabs, each step under its own
# timeout ($STEP_S, default 120 s):
#   1. `qwasi verify --backend cuda` on every fixture with pages (snapshots
#      restored while their writer lives: pages shared + the last copied;
#      from host memory; adopted after the writer is gone, which gave back
#      the pages past the snapshot), $OUT/verify-pages.json;
#   2. `verify --synthetic` at 40 layers with a $PROMPT-token prompt (2,500:
#      two full 1,024-row pages of each f32 K/V buffer shared on restore, the
#      batched step against each row alone), $OUT/verify-synthetic-pages.json;
#   3. compute-sanitizer memcheck over one fixture with pages (reads past
#      the mapped rows would show here), $OUT/sanitizer-pages.log;
#   4. batch-1 speed at $LENS with pages, then without
#      (growing maps a page per 1,024 rows: no decode cost expected),
#      $OUT/speed-pages.json and $OUT/speed-slabs.json (ROUNDS rounds, default
#      1: both in turn per round, -rN in the names past the first);
#   5. the GPU soak with pages under memory pressure (--kv-cache-mib 17: two
#      demo-model sequences of one 2 MB page a buffer fit; --max-tokens 4500,
#      so some cross 4,032 tokens and grow a page: the scheduler preempts),
#      --expect-preemptions, $SOAK_S seconds (90), $OUT/soak-pages.json. It
#      needs guests/target/wasm32-wasip2/release/qwasi_openai_guest.wasm.
# Env: QWASI_BIN (.dev/qwasi), PROMPT (2500), LENS (512,8192), ROUNDS (1),
#      SKIP (steps).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=$(readlink -f "${QWASI_BIN:-.dev/qwasi}")
T="timeout ${STEP_S:-120}"
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
rc=0
export QWASI_KV_PAGES=1
if ! skip 1; then
  $T "$BIN" verify --backend cuda --json "$OUT/verify-pages.json" > "$OUT/verify-pages.log" 2>&1 || rc=1
  grep -E "restore|adopt|FAIL" "$OUT/verify-pages.log" | tail -6
  echo "verify (pages): $(tail -1 "$OUT/verify-pages.log")"
fi
if ! skip 2; then
  $T "$BIN" verify --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b --layers 40 \
    --prompt-len "${PROMPT:-2500}" --gen-tokens 16 --json "$OUT/verify-synthetic-pages.json" \
    > "$OUT/verify-synthetic-pages.log" 2>&1 || rc=1
  grep -E "restore|adopt|FAIL" "$OUT/verify-synthetic-pages.log" | tail -6
  echo "verify --synthetic (pages): $(tail -1 "$OUT/verify-synthetic-pages.log")"
fi
if ! skip 3 && command -v compute-sanitizer > /dev/null; then
  $T compute-sanitizer --tool memcheck --print-limit 20 "$BIN" verify --backend cuda \
    --model tests/fixtures/models/moe-flat > "$OUT/sanitizer-pages.log" 2>&1 || rc=1
  tail -3 "$OUT/sanitizer-pages.log"
fi
if ! skip 4; then
  for round in $(seq 1 "${ROUNDS:-1}"); do
    for v in 1 0; do
      name=$([ $v = 1 ] && echo pages || echo slabs)$([ "$round" = 1 ] || echo "-r$round")
      QWASI_KV_PAGES=$v $T "$BIN" bench --workload speed --backend cuda --synthetic qwen3.6-35b-a3b \
        --fixtures /nonexistent --lens "${LENS:-512,8192}" --decode-tokens 128 --runs 3 --warmups 1 \
        --out "$OUT/speed-$name.json" > "$OUT/speed-$name.log" 2>&1 || rc=1
      echo "== $name"; grep -iE "tok/s|TTFT|error" "$OUT/speed-$name.log" | tail -4
    done
  done
fi
if ! skip 5; then
  timeout $(( ${SOAK_S:-90} + 120 )) python3 scripts/soak --bin "$BIN" --duration "${SOAK_S:-90}" \
    --report "$OUT/soak-pages.json" --serve-arg=--backend --serve-arg=cuda \
    --serve-arg=--kv-cache-mib --serve-arg=17 --max-tokens 4500 --expect-preemptions \
    > "$OUT/soak-pages.log" 2>&1 || rc=1
  grep -E "soak FAILED|RSS:" "$OUT/soak-pages.log" | tail -4
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); m=d['metrics_after']; print('outcomes', d['outcomes']); print('preemptions', m.get('qwasi_preemptions_total'), 'failed', m.get('qwasi_requests_finished_total{reason=\"failed\"}'))" "$OUT/soak-pages.json"
fi
exit $rc
