#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a qwasi binary built with
# `--features cuda` carried in (QWASI_BIN, default target/release/qwasi):
#   1. `qwasi verify --backend cuda` over every fixture (the user-facing check);
#   2. `qwasi serve --backend cuda` on the demo model: a streamed and a plain
#      greedy completion through the real guests, compared with the CPU
#      reference (`qwasi generate --backend cpu`) on the same prompt.
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
curl -s localhost:$PORT/metrics > "$OUT/serve-metrics.txt"
kill -TERM $pid; wait $pid
$BIN generate --backend cpu --prompt "$PROMPT" --max-tokens $N --ignore-eos --json > "$OUT/cpu-generate.json"
python3 - "$OUT" <<'PY' || rc=1
import json, sys
out = sys.argv[1]
gpu = json.load(open(f"{out}/serve-completion.json"))["choices"][0]["text"]
cpu = json.load(open(f"{out}/cpu-generate.json"))["text"]
stream = open(f"{out}/serve-chat-stream.txt").read()
ok = gpu == cpu and stream.rstrip().endswith("data: [DONE]")
json.dump({"serve_cuda_text_equals_cpu": gpu == cpu, "stream_done": stream.rstrip().endswith("data: [DONE]"),
           "gpu_text": gpu, "cpu_text": cpu}, open(f"{out}/serve-check.json", "w"), indent=1)
print("serve --backend cuda vs cpu:", "PASS" if ok else "FAIL", repr(gpu[:80]), repr(cpu[:80]))
sys.exit(0 if ok else 1)
PY
echo "exit $rc"
exit $rc
