#!/usr/bin/env bash
# On the GPU machine, from the repository root: constrained decoding with the
# mask on the device (#24: <= 10% of batch-1 decode speed, nothing for
# unconstrained requests).
#   1. `qwasi verify` on the fixtures and the synthetic Qwen3.6-35B-A3B
#      (40 layers): besides the usual checks, each model's constrained check
#      (a JSON schema, a regex, a choice, and on the Qwen3.6 vocabulary one
#      after `</think>`; greedy, top-k, top-p): the device masks' tokens equal
#      the host mask's, alone and batched beside unconstrained rows;
#   2. `qwasi bench --workload speed --constrained` at 512 tokens of prompt:
#      unconstrained greedy decode, then the same held to the regex of
#      scripts/bench_structured.py with the mask on the device (greedy and
#      top-k 20) and on the host (the old path), 256 tokens each;
#   3. only when a served checkpoint is already there ($MODEL/config.json,
#      e.g. left by serve_apis.sh): scripts/bench_structured.py through
#      `qwasi serve --backend cuda`, the measurement of #24's bound as served.
# Env: QWASI_BIN (.dev/qwasi, unpacked from .dev/qwasi.xz when missing), MODEL
#      (/dev/shm/m40), RUNS (3), TOKENS (256).
# Output: $OUT/{verify,speed,structured,constrained}.json and the logs.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-.dev/qwasi}
if [ ! -x "$BIN" ] && [ -f "$BIN.xz" ]; then
  xz -dkf "$BIN.xz" && chmod +x "$BIN"
fi
MODEL=${MODEL:-/dev/shm/m40}
RUNS=${RUNS:-3}
TOKENS=${TOKENS:-256}
rc=0
echo "== verify (fixtures + synthetic, with the constrained checks)"
"$BIN" verify --backend cuda --synthetic qwen3.6-35b-a3b --gen-tokens 16 --json "$OUT/verify.json" \
  > "$OUT/verify.log" 2>&1 || rc=1
grep -E "constrained|^verify:" "$OUT/verify.log" | cut -c1-400
echo "== bench speed --constrained"
"$BIN" bench --workload speed --backend cuda --lens 512 --decode-tokens "$TOKENS" --runs "$RUNS" --warmups 1 \
  --constrained --out "$OUT/speed.json" > "$OUT/speed.log" 2>&1 || rc=1
grep -E "fixtures:|\] L " "$OUT/speed.log"
if [ -e "$MODEL/config.json" ]; then
  echo "== served: scripts/bench_structured.py"
  PORT=8322
  "$BIN" serve --backend cuda --model "$MODEL" --port $PORT \
    --chat-template tests/fixtures/chat/qwen3_6_format.jinja > "$OUT/serve.log" 2>&1 &
  SRV=$!
  trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null' EXIT
  for _ in $(seq 1 600); do
    curl -sf http://127.0.0.1:$PORT/ready > /dev/null && break
    kill -0 $SRV 2>/dev/null || { echo "serve exited"; tail -20 "$OUT/serve.log"; rc=1; break; }
    sleep 0.5
  done
  python3 scripts/bench_structured.py --url http://127.0.0.1:$PORT --runs "$RUNS" --tokens "$TOKENS" \
    | tee "$OUT/structured.json" || rc=1
else
  echo "(no $MODEL/config.json: the served measurement is skipped; serve_apis.sh writes the checkpoint)"
fi
python3 - "$OUT" <<'PY' || rc=1
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
v, s, served = load("verify.json"), load("speed.json"), load("structured.json")
r = {"verify_pass": v and v.get("pass"),
     "constrained_checks": v and {"fixtures": v.get("constrained"), "synthetic": v.get("synthetic_constrained")}}
if s:
    res = s.get("results") or s.get("lens") or []
    r["speed"] = [{"prompt_len": x.get("prompt_len"), "unconstrained_tok_s": x["decode_tok_per_s"]["median"],
                   "constrained": x.get("constrained_decode")} for x in res]
r["served"] = served
json.dump(r, open(os.path.join(out, "constrained.json"), "w"), indent=1)
print(json.dumps({"verify_pass": r["verify_pass"],
                  "greedy_over_unconstrained": [x["constrained"] and x["constrained"]["greedy_over_unconstrained"]
                                                for x in r.get("speed", [])],
                  "served": served and served.get("constrained_over_unconstrained")}))
PY
echo "exit $rc"
exit $rc
