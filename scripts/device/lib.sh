# Shared by the device scripts that serve the 40-layer checkpoint
# (serve_apis.sh, serving.sh, ttft.sh); sourced, from the repository root:
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Sets OUT (/tmp/qwasi-out, created), BIN ($QWASI_BIN, .dev/qwasi), MODEL
# (/dev/shm/m40), PORT, URL and rc=0 (the script's exit status: helpers set
# it to 1 on a failure they do not stop at). With SYNTHETIC=PRESET (e.g.
# qwen3.6-35b-a3b) the server serves that preset's seeded random weights made
# on the GPU (`serve --synthetic`) and no checkpoint is written: for A/B runs
# where the GPU cannot hold transformers' copy of the 40-layer model (an
# H100, where the weights leave ~15 GB: SERVE_ARGS="--kv-cache-mib 6000
# --prefix-cache-mib 1024"); the user's path (the checkpoint) stays the
# default.
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-.dev/qwasi}
MODEL=${MODEL:-/dev/shm/m40}
PORT=8321
URL=http://127.0.0.1:$PORT
rc=0
if [ -n "${SYNTHETIC:-}" ]; then MODEL_ARGS=(--synthetic "$SYNTHETIC"); else MODEL_ARGS=(--model "$MODEL"); fi

# `qwasi verify --backend cuda` on the fixtures into $OUT/verify.{json,log}
# (rc=1 when it fails), then "$1: " and the log's last line.
qw_verify() {
  "$BIN" verify --backend cuda --json "$OUT/verify.json" > "$OUT/verify.log" 2>&1 || rc=1
  echo "$1: $(tail -1 "$OUT/verify.log")"
}

# The 40-layer checkpoint written by transformers into $MODEL (GEN: the path
# of gen_hf_checkpoint.py), skipped when $MODEL/config.json exists or
# SYNTHETIC is set, with TOKENIZER (.dev/tokenizer.json, the embedded Qwen3.6
# vocabulary: zstd -d host/engine/assets/qwen36_tokenizer.json.zst) copied in
# (the bench times chunks carrying text). Ends the script when it fails.
qw_checkpoint() {
  [ -n "${SYNTHETIC:-}" ] && return
  local tok=${TOKENIZER:-.dev/tokenizer.json}
  [ -e "$tok" ] || { echo "checkpoint: no $tok (zstd -d host/engine/assets/qwen36_tokenizer.json.zst -o $tok, carried): without one the server streams no text and the bench times nothing"; exit 1; }
  if [ ! -e "$MODEL/config.json" ]; then
    python3 "${GEN:-.dev/gen_hf_checkpoint.py}" --layers 40 --out "$MODEL" \
      --tokenizer "$tok" > "$OUT/gen.log" 2>&1 || { echo "checkpoint: failed"; tail "$OUT/gen.log"; exit 1; }
  fi
  [ -e "$MODEL/tokenizer.json" ] || cp "$tok" "$MODEL/tokenizer.json"
}

# `qwasi serve --backend cuda --model $MODEL --port $PORT` (--synthetic
# $SYNTHETIC instead of --model where set), $SERVE_ARGS and the further
# arguments, its output in the log file $1, in the background (SRV: its pid);
# returns once it answers /ready (or after 5 minutes), ends the script when
# it exits first.
qw_serve() {
  local log=$1
  shift
  "$BIN" serve --backend cuda "${MODEL_ARGS[@]}" --port $PORT ${SERVE_ARGS:-} "$@" > "$log" 2>&1 &
  SRV=$!
  for _ in $(seq 1 600); do
    curl -sf $URL/ready > /dev/null && break
    kill -0 $SRV 2>/dev/null || { echo "serve exited"; tail -20 "$log"; exit 1; }
    sleep 0.5
  done
}
