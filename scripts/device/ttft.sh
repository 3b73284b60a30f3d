#!/usr/bin/env bash
# On the GPU machine, from the repository root: batch-1 prompt latency as a
# user sees it (issue 27), in two parts that each fit one device call.
#   PART=verify: `qwasi verify --backend cuda` on the fixtures, then the
#     synthetic 40-layer model with an $SMOKE_PROMPT-token prompt (its
#     in-pass snapshot check times the prompt with and without the prefix
#     cache's snapshots); the tokenizer bench.
#   PART=serve: the 40-layer checkpoint written by transformers into tmpfs
#     (GEN, skipped when $MODEL exists), `qwasi serve --backend cuda` once
#     per mode of $MODES, each measured by `qwasi bench --workload serving`
#     at concurrency 1 over $N distinct $PROMPT-token prompts (client-side
#     TTFT). Modes: default (the shipped configuration), interval0
#     (--snapshot-interval 0), bf16 and fp8 (--prefill-precision; fp8 takes
#     FP8 tensor cores only on a block-FP8 checkpoint: MODEL=/dev/shm/m40-fp8
#     from serving_fp8.sh).
# Env: QWASI_BIN (.dev/qwasi), MODEL (/dev/shm/m40), GEN, TOKENIZER,
#      SMOKE_PROMPT (8192), PROMPT (8192), N (6), MODES ("default interval0").
# Output: $OUT/{verify,smoke,tokenize}.json, $OUT/ttft-MODE.json per mode.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PROMPT=${PROMPT:-8192}
N=${N:-6}
case "${PART:-verify}" in
verify)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  qw_verify fixtures
  "$BIN" verify --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b --prompt-len "${SMOKE_PROMPT:-8192}" \
    --gen-tokens 16 --json "$OUT/smoke.json" > "$OUT/smoke.log" 2>&1 || rc=1
  grep -E "snapshots inside|batched:|verify:" "$OUT/smoke.log"
  "$BIN" bench --workload tokenize --out "$OUT/tokenize.json" 2>&1 | tail -4 || rc=1
  ;;
serve)
  qw_checkpoint
  for mode in ${MODES:-default interval0}; do
    case "$mode" in
      default) extra="" ;;
      interval0) extra="--snapshot-interval 0" ;;
      bf16 | fp8) extra="--prefill-precision $mode" ;;
      *) echo "unknown mode $mode"; exit 1 ;;
    esac
    # shellcheck disable=SC2086
    qw_serve "$OUT/serve-$mode.log" $extra
    echo "== $mode: $N prompts of $PROMPT tokens, one at a time"
    "$BIN" bench --workload serving --url $URL --concurrency 1 --num-prompts "$N" --prompt-tokens "$PROMPT" \
      --output-tokens 16 --out "$OUT/ttft-$mode.json" 2>&1 | grep -v "^\[bench\] request" | tail -4 || rc=1
    curl -s $URL/metrics | grep -E "^qwasi_(first_token_phase|prefix_cache_snapshots)" >> "$OUT/metrics-$mode.txt"
    kill $SRV; wait $SRV 2>/dev/null
  done
  ;;
esac
exit $rc
