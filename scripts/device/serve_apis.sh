#!/usr/bin/env bash
# On the GPU machine, from the repository root: what a user sees through
# `qwasi serve --backend cuda` on a 40-layer checkpoint in the Hugging Face
# layout, with the correctness check of the same binary first.
#   1. `qwasi verify` (the reference fixtures) with this binary;
#   2. the checkpoint written by transformers into tmpfs (GEN: the path of
#      gen_hf_checkpoint.py, carried in; skipped when $MODEL exists);
#   3. one `qwasi serve --backend cuda` for everything below:
#      - constrained decoding's cost at batch 1 (scripts/bench_structured.py,
#        #24: <= 10%);
#      - the same conversation streamed through /v1/chat/completions,
#        /v1/responses and /v1/messages (#25: within 2%);
#      - `qwasi bench --workload serving --url` at $CONC (1,8).
# Env: QWASI_BIN (.dev/qwasi), MODEL (/dev/shm/m40), GEN, TOKENIZER, CONC,
#      RUNS (3), TOKENS (256). Output: $OUT/{verify,structured,apis,serving}.json.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RUNS=${RUNS:-3}
TOKENS=${TOKENS:-256}
qw_verify verify
qw_checkpoint
qw_serve "$OUT/serve.log" --chat-template tests/fixtures/chat/qwen3_6_format.jinja
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null' EXIT
echo "== constrained decoding at batch 1"
python3 scripts/bench_structured.py --url $URL --runs "$RUNS" --tokens "$TOKENS" | tee "$OUT/structured.json" || rc=1
echo "== the chat APIs"
python3 - "$URL" "$RUNS" "$TOKENS" "$OUT/apis.json" <<'EOF' || rc=1
import json, statistics, sys, urllib.request
sys.path.insert(0, "benchmarks")
import wasm_overhead as w
url, runs, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
msgs = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 4}]
by = {api: [] for api in w.CHAT_APIS}
for _ in range(runs + 1):  # the first round warms up
    for api in w.CHAT_APIS:
        by[api].append(w.stream_chat_api(url, model, api, msgs, n))
med = {api: statistics.median(v[1:]) for api, v in by.items()}
base = med["chat_completions"]
r = {"tokens": n, "runs": runs, "decode_tok_per_s_median": med, "all": by,
     "vs_chat_completions_pct": {api: 100 * (v / base - 1) for api, v in med.items()}}
json.dump(r, open(out, "w"), indent=1)
print(json.dumps({k: r[k] for k in ("decode_tok_per_s_median", "vs_chat_completions_pct")}))
EOF
echo "== serving"
"$BIN" bench --workload serving --url $URL --concurrency "${CONC:-1,8}" --num-prompts 16 \
  --prompt-tokens 1024 --output-tokens "$TOKENS" --fixtures /nonexistent --out "$OUT/serving.json" 2>&1 \
  | grep '^\[bench\]' || rc=1
echo "exit $rc"
exit $rc
