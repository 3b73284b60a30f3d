#!/usr/bin/env bash
# On the GPU machine, from the repository root: does the default memory split
# hold on this card? One `qwasi serve --backend cuda` with no memory flags
# (the KV and prefix-cache budgets it measures past its work reserve), then:
#   1. two 16K-token prompts alone (the largest pass, PREFILL_CHUNK tokens);
#   2. 24 streams of 8K-token prompts at once (more than an 80 GB card's
#      budget holds: admission waits and preemptions);
#   3. the 16K-token prompts again, with the prefix cache and the parked KV
#      pages now full.
# Every request must complete (the bench reports failures); the server's
# budget lines and the metrics after go to $OUT.
# Env: as lib.sh (SYNTHETIC=qwen3.6-35b-a3b needs no checkpoint).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
qw_checkpoint
qw_serve "$OUT/serve-memory.log"
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null' EXIT
grep -E "prefix cache|KV memory|budget|sequence fits" "$OUT/serve-memory.log"
run() {
  "$BIN" bench --workload serving --url $URL --concurrency "$1" --num-prompts "$2" --prompt-tokens "$3" \
    --output-tokens "$4" --out "$OUT/memory-$5.json" 2>&1 | grep -E "^\[bench\] c=|error" || rc=1
}
echo "== memory: 16K prompts alone, 24 x 8K at once, 16K alone again"
run 1 2 16384 16 16k-first
run 24 24 8192 64 8k-24
run 1 2 16384 16 16k-again
curl -s $URL/metrics | grep -E "^qwasi_(sequences|kv_cache|preemptions|prefix_cache_bytes|requests_total)" \
  | tee "$OUT/metrics-memory.txt"
exit $rc
