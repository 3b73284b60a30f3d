#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a qwasi binary built with
# `--features cuda` carried in (QWASI_BIN, default target/release/qwasi):
#   1. `qwasi verify --backend cuda` over every fixture (the user-facing check);
#   2. `qwasi serve --backend cuda` on the demo model: a streamed and a plain
#      greedy completion through the real guests, compared with the CPU
#      reference (`qwasi generate --backend cpu`) on the same prompt; and
#      sampled completions through each device readout, twice per seed.
# Results land in $OUT (or /tmp/qwasi-out).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-target/release/qwasi}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== qwasi verify --backend cuda"
$BIN verify --backend cuda --json "$OUT/verify.json" 2>&1 | tee "$OUT/verify.log" || rc=1

echo "== qwasi serve --backend cuda (demo model)"
PORT=18123
$BIN serve --backend cuda --port $PORT > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 600); do curl -sf localhost:$PORT/ready >/dev/null && break; sleep 0.2; done
PROMPT="The quick brown fox"
N=32
curl -s localhost:$PORT/v1/completions -H 'Content-Type: application/json' \
  -d "{\"model\":\"qwasi-demo\",\"prompt\":\"$PROMPT\",\"max_tokens\":$N,\"temperature\":0,\"ignore_eos\":true}" \
  > "$OUT/serve-completion.json"
curl -sN localhost:$PORT/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"qwasi-demo","messages":[{"role":"user","content":"hi"}],"max_tokens":16,"stream":true}' \
  > "$OUT/serve-chat-stream.txt"
# Sampled requests through each device readout (top-k: the head; temperature:
# the row's block sums; top-p: either), each sent twice with one seed: same
# text both times, all tokens there, logprobs where asked.
for s in '"top_k":20,"top_p":0.95,"logprobs":3' '"temperature":0.8' '"top_p":0.9,"logprobs":2'; do
  for run in 1 2; do
    curl -s localhost:$PORT/v1/completions -H 'Content-Type: application/json' \
      -d "{\"model\":\"qwasi-demo\",\"prompt\":\"$PROMPT\",\"max_tokens\":$N,\"temperature\":0.7,\"seed\":7,\"ignore_eos\":true,$s}"
    echo
  done
done > "$OUT/serve-sampled.jsonl"
curl -s localhost:$PORT/metrics > "$OUT/serve-metrics.txt"
kill -TERM $pid; wait $pid
$BIN generate --backend cpu --prompt "$PROMPT" --max-tokens $N --ignore-eos --json > "$OUT/cpu-generate.json"
python3 - "$OUT" <<'PY' || rc=1
import json, sys
out = sys.argv[1]
gpu = json.load(open(f"{out}/serve-completion.json"))["choices"][0]["text"]
cpu = json.load(open(f"{out}/cpu-generate.json"))["text"]
stream = open(f"{out}/serve-chat-stream.txt").read()
sampled = [json.loads(l) for l in open(f"{out}/serve-sampled.jsonl") if l.strip()]
pairs = [(sampled[i], sampled[i + 1]) for i in range(0, len(sampled), 2)]
def full(r):
    c = r["choices"][0]
    return r["usage"]["completion_tokens"] == 32 and c["finish_reason"] == "length"
sampled_ok = len(pairs) == 3 and all(a["choices"][0]["text"] == b["choices"][0]["text"] and full(a) and full(b) for a, b in pairs)
sampled_ok &= all(p[0]["choices"][0].get("logprobs") for p in (pairs[0], pairs[2]))
ok = gpu == cpu and stream.rstrip().endswith("data: [DONE]") and sampled_ok
json.dump({"serve_cuda_text_equals_cpu": gpu == cpu, "stream_done": stream.rstrip().endswith("data: [DONE]"),
           "sampled_same_seed_same_text_and_complete": sampled_ok,
           "sampled_texts": [p[0]["choices"][0]["text"] for p in pairs],
           "gpu_text": gpu, "cpu_text": cpu}, open(f"{out}/serve-check.json", "w"), indent=1)
print("serve --backend cuda vs cpu:", "PASS" if gpu == cpu else "FAIL", repr(gpu[:80]), repr(cpu[:80]))
print("sampled (top-k, temperature, top-p; same seed twice):", "PASS" if sampled_ok else "FAIL", [p[0]["choices"][0]["text"][:40] for p in pairs])
sys.exit(0 if ok else 1)
PY
echo "exit $rc"
exit $rc
