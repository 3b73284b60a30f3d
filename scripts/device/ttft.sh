#!/usr/bin/env bash
# On the GPU machine, from the repository root: batch-1 prompt latency as a
# user sees it (issue 27), in two parts that each fit one device call.
#   PART=verify: `qwasi verify --backend cuda` on the fixtures, then the
#     synthetic 40-layer model with an $SMOKE_PROMPT-token prompt (its
#     in-pass snapshot check times the prompt with and without the prefix
#     cache's snapshots); the tokenizer bench.
#   PART=serve: the 40-layer checkpoint written by transformers into tmpfs
#     (GEN, skipped when $MODEL exists), `qwasi serve --backend cuda` with
#     its default configuration and again with --snapshot-interval 0, each
#     measured by `qwasi bench --workload serving` at concurrency 1 over
#     $N distinct $PROMPT-token prompts (client-side TTFT).
# Env: QWASI_BIN (.dev/qwasi), MODEL (/dev/shm/m40), GEN, TOKENIZER,
#      SMOKE_PROMPT (8192), PROMPT (8192), N (6).
# Output: $OUT/{verify,smoke,tokenize,ttft-default,ttft-interval0}.json.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-.dev/qwasi}
MODEL=${MODEL:-/dev/shm/m40}
PROMPT=${PROMPT:-8192}
N=${N:-6}
rc=0
case "${PART:-verify}" in
verify)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  "$BIN" verify --backend cuda --json "$OUT/verify.json" > "$OUT/verify.log" 2>&1 || rc=1
  echo "fixtures: $(tail -1 "$OUT/verify.log")"
  "$BIN" verify --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b --prompt-len "${SMOKE_PROMPT:-8192}" \
    --gen-tokens 16 --json "$OUT/smoke.json" > "$OUT/smoke.log" 2>&1 || rc=1
  grep -E "snapshots inside|batched:|verify:" "$OUT/smoke.log"
  "$BIN" bench --workload tokenize --out "$OUT/tokenize.json" 2>&1 | tail -4 || rc=1
  ;;
serve)
  if [ ! -e "$MODEL/config.json" ]; then
    python3 "${GEN:-.dev/gen_hf_checkpoint.py}" --layers 40 --out "$MODEL" \
      ${TOKENIZER:+--tokenizer "$TOKENIZER"} > "$OUT/gen.log" 2>&1 || { echo "checkpoint: failed"; tail "$OUT/gen.log"; exit 1; }
  fi
  PORT=8321
  URL=http://127.0.0.1:$PORT
  for mode in default interval0; do
    extra=""
    [ "$mode" = interval0 ] && extra="--snapshot-interval 0"
    # shellcheck disable=SC2086
    "$BIN" serve --backend cuda --model "$MODEL" --port $PORT $extra > "$OUT/serve-$mode.log" 2>&1 &
    SRV=$!
    for _ in $(seq 1 600); do
      curl -sf $URL/ready > /dev/null && break
      kill -0 $SRV 2>/dev/null || { echo "serve exited"; tail -20 "$OUT/serve-$mode.log"; exit 1; }
      sleep 0.5
    done
    echo "== $mode: $N prompts of $PROMPT tokens, one at a time"
    "$BIN" bench --workload serving --url $URL --concurrency 1 --num-prompts "$N" --prompt-tokens "$PROMPT" \
      --output-tokens 16 --out "$OUT/ttft-$mode.json" 2>&1 | grep -v "^\[bench\] request" | tail -4 || rc=1
    curl -s $URL/metrics | grep -E "^qwasi_(first_token_phase|prefix_cache_snapshots)" >> "$OUT/metrics-$mode.txt"
    kill $SRV; wait $SRV 2>/dev/null
  done
  ;;
esac
exit $rc
