#!/usr/bin/env bash
# On the GPU machine, from the repository root: continuous batching as a user
# sees it (issue 23), through `qwasi serve --backend cuda` on a 40-layer
# checkpoint in the Hugging Face layout, with the correctness check of the
# same binary first.
#   1. `qwasi verify --backend cuda` (the fixtures, each batched against alone);
#   2. the checkpoint written by transformers into tmpfs (GEN: the path of
#      gen_hf_checkpoint.py, carried in; skipped when $MODEL exists);
#   3. one `qwasi serve --backend cuda`, then `qwasi bench --workload serving
#      --url` at $CONC (1K prompts, $TOKENS tokens each);
#   4. a 32K prompt arriving while 16 streams decode: the streams' inter-token
#      latency with it (serving-long.json) and the long request itself;
#   5. with BUDGET2 set, a second server with --max-num-batched-tokens
#      $BUDGET2 at concurrency 8 and 16 (serving-budget$BUDGET2.json);
#   6. with BF16_CONC set (e.g. 8,64), a server with --prefill-precision
#      bf16 at those concurrencies (serving-bf16.json);
#   7. for each N of CAPS (e.g. 256,512), a server with
#      --prefill-while-decoding N: step 4 again (serving-long-capN.json,
#      long-capN.json), 16 streams of 1K prompts (serving-capN.json) and
#      with CONC_8K 8K prompts (serving-8k-capN.json);
#   8. the same for each N of LONG_CHUNKS (e.g. 0,256) with
#      --long-prompt-chunk N (serving-long-chunkN.json, long-chunkN.json,
#      serving-chunkN.json); the first server has the default.
# Steps 3b and 3c run on the first server, after step 3: with CONC_8K set
# (e.g. 1,8,16), 8K-token prompts at those concurrencies (serving-8k.json);
# with RATES set (e.g. 2,4,8), 1K prompts arriving as a Poisson process at
# those requests per second (serving-rate.json).
# Env: QWASI_BIN (.dev/qwasi), MODEL (/dev/shm/m40) or SYNTHETIC (lib.sh), GEN, TOKENIZER, CONC
#      (1,8,16,32,64), TOKENS (256), CAPS (none), LONG_CHUNKS (none), CONC_8K
#      (none), RATES (none). Output: $OUT/{verify,serving,serving-long,long}.json.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CONC=${CONC:-1,8,16,32,64}
TOKENS=${TOKENS:-256}
CAPS=${CAPS:-}
LONG_CHUNKS=${LONG_CHUNKS:-}
qw_verify verify
qw_checkpoint
qw_serve "$OUT/serve.log"
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null' EXIT
echo "== serving at $CONC"
"$BIN" bench --workload serving --url $URL --concurrency "$CONC" --prompt-tokens 1024 \
  --output-tokens "$TOKENS" --out "$OUT/serving.json" 2>&1 | grep -v "^\[bench\] request" | tail -12 || rc=1
if [ -n "${CONC_8K:-}" ]; then
  echo "== 8K prompts at $CONC_8K"
  "$BIN" bench --workload serving --url $URL --concurrency "$CONC_8K" --prompt-tokens 8192 \
    --output-tokens "$TOKENS" --out "$OUT/serving-8k.json" 2>&1 | grep "^\[bench\] c=" || rc=1
fi
if [ -n "${RATES:-}" ]; then
  echo "== Poisson arrivals at $RATES requests/s"
  "$BIN" bench --workload serving --url $URL --request-rate "$RATES" \
    --prompt-tokens 1024 --output-tokens "$TOKENS" --out "$OUT/serving-rate.json" 2>&1 \
    | grep -v "^\[bench\] request" | tail -6 || rc=1
fi
# A 32K prompt arriving while 16 streams decode: serving-long$1.json (the
# streams), long$1.json (the long request).
long_arrival() {
  echo "== a 32K prompt arriving while 16 streams decode $2"
  "$BIN" bench --workload serving --url $URL --concurrency 16 --num-prompts 16 --prompt-tokens 1024 \
    --output-tokens 1024 --out "$OUT/serving-long$1.json" > "$OUT/serving-long$1.log" 2>&1 &
  BG=$!
  sleep 5
  "$BIN" bench --workload serving --url $URL --concurrency 1 --num-prompts 1 --prompt-tokens 32768 \
    --output-tokens 16 --out "$OUT/long$1.json" 2>&1 | tail -3 || rc=1
  wait $BG || rc=1
  tail -4 "$OUT/serving-long$1.log"
}
long_arrival "" ""
curl -s $URL/metrics | grep -E "^qwasi_(sequences|kv_cache|preemptions)" | tee "$OUT/metrics-after.txt"
if [ -n "${BUDGET2:-}" ]; then
  echo "== --max-num-batched-tokens $BUDGET2 at 8,16"
  kill $SRV; wait $SRV 2>/dev/null
  "$BIN" serve --backend cuda "${MODEL_ARGS[@]}" --port $PORT ${SERVE_ARGS:-} --max-num-batched-tokens "$BUDGET2" \
    > "$OUT/serve2.log" 2>&1 &
  SRV=$!
  for _ in $(seq 1 600); do curl -sf $URL/ready > /dev/null && break; sleep 0.5; done
  "$BIN" bench --workload serving --url $URL --concurrency 8,16 --prompt-tokens 1024 \
    --output-tokens "$TOKENS" --out "$OUT/serving-budget$BUDGET2.json" 2>&1 | grep "^\[bench\] c=" || rc=1
fi
if [ -n "${BF16_CONC:-}" ]; then
  echo "== --prefill-precision bf16 at $BF16_CONC"
  kill $SRV; wait $SRV 2>/dev/null
  qw_serve "$OUT/serve-bf16.log" --prefill-precision bf16
  "$BIN" bench --workload serving --url $URL --concurrency "$BF16_CONC" --prompt-tokens 1024 \
    --output-tokens "$TOKENS" --out "$OUT/serving-bf16.json" 2>&1 | grep "^\[bench\] c=" || rc=1
fi
# A server with "$2 $3" (tag $1): step 4 again, 16 streams of 1K prompts
# and, with CONC_8K set, 8K prompts at those concurrencies (serving-8k-$1.json).
variant() {
  kill $SRV; wait $SRV 2>/dev/null
  qw_serve "$OUT/serve-$1.log" "$2" "$3"
  long_arrival "-$1" "($2 $3)"
  "$BIN" bench --workload serving --url $URL --concurrency 16 --prompt-tokens 1024 \
    --output-tokens "$TOKENS" --out "$OUT/serving-$1.json" 2>&1 | grep "^\[bench\] c=" || rc=1
  if [ -n "${CONC_8K:-}" ]; then
    "$BIN" bench --workload serving --url $URL --concurrency "$CONC_8K" --prompt-tokens 8192 \
      --output-tokens "$TOKENS" --out "$OUT/serving-8k-$1.json" 2>&1 | grep "^\[bench\] c=" || rc=1
  fi
}
for cap in ${CAPS//,/ }; do variant "cap$cap" --prefill-while-decoding "$cap"; done
for n in ${LONG_CHUNKS//,/ }; do variant "chunk$n" --long-prompt-chunk "$n"; done
exit $rc
