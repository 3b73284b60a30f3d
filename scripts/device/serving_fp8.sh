#!/usr/bin/env bash
# On the GPU machine, from the repository root: serving a 40-layer block-FP8
# checkpoint in the Hugging Face layout of Qwen/Qwen3.6-35B-A3B-FP8 (issue 28),
# the same benchmark as serving.sh on the BF16 checkpoint.
#   1. `qwasi verify --backend cuda` on the fixtures (the FP8 fixture included);
#   2. the BF16 checkpoint written by transformers into tmpfs (GEN: the path of
#      gen_hf_checkpoint.py, carried in), converted to FP8 by
#      scripts/device/fp8_checkpoint.py into $MODEL_FP8 (transformers' own
#      quantizer, on the GPU), deleting each BF16 shard once converted; both
#      skipped when $MODEL_FP8/config.json exists (written last by the
#      converter), and a leftover half-converted pair is removed first;
#   3. one `qwasi serve --backend cuda --model $MODEL_FP8`: load time (to
#      /ready, and the server's own "model loaded in"), the device bytes of
#      weights it prints ("weights on the GPU ... GB (block-FP8 kept quantized,
#      + work buffers)") and the GPU memory in use after load (nvidia-smi);
#   4. `qwasi bench --workload serving --url` at $CONC ($PROMPT-token prompts,
#      $TOKENS tokens each).
# Budget of the GPU machine (128 GB RAM, /dev/shm a tmpfs of up to 128 GB
# sharing that RAM, 64 GB disk): the BF16 checkpoint is 69.7 GB (64.9 GiB) and
# the FP8 one 35.8 GB (from the 2- and 4-layer conversions: 2.03 GB of BF16
# embedding and lm_head, then 1.69 GB BF16 / 0.85 GB FP8 a layer). The disk
# cannot hold the BF16 one, and both at once in tmpfs (~106 GB) plus the
# converter's RAM would leave too little for anything else, so the conversion
# deletes each BF16 shard as soon as its FP8 shard is written (tmpfs peak
# ~70 GB + one FP8 shard; the converter holds about one output shard, ~3.5 GB,
# in RAM, and one fused expert tensor, 1 GB, on the GPU). What stays is the
# FP8 checkpoint (~36 GB of tmpfs), which the server
# memory-maps (no second copy in RAM). KEEP_BF16=1 keeps the input (only with
# room to spare). Budget of a call (10 minutes): writing the BF16 checkpoint
# takes ~2 minutes; the conversion has not run there yet (at 2 layers on 2
# shared CPU cores it took 8-61 s for 5.4 GB of BF16, i.e. ~2-10 minutes for
# the 65 GB on the CPU; on the GPU it should be bound by tmpfs copies). If
# a call runs out, the next one on the same warm machine starts step 2 again
# from scratch, so split it: SKIP=serve ends after step 2 (the FP8 checkpoint
# stays in tmpfs while the machine is warm), then SKIP=verify serves and
# benchmarks. SKIP ("verify", "serve", "bench") leaves steps out.
# Env: QWASI_BIN (.dev/qwasi), MODEL (/dev/shm/m40: the BF16 checkpoint),
#      MODEL_FP8 (/dev/shm/m40-fp8), GEN, TOKENIZER, PYTHON (python3), CONC
#      (1,8,16,32,64), PROMPT (1024), TOKENS (256), KEEP_BF16, SKIP.
# Output: $OUT/{verify,serving-fp8,fp8-load}.json, $OUT/{gen,convert,serve-fp8}.log.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MODEL_FP8=${MODEL_FP8:-/dev/shm/m40-fp8}
PYTHON=${PYTHON:-python3}
CONC=${CONC:-1,8,16,32,64}
PROMPT=${PROMPT:-1024}
TOKENS=${TOKENS:-256}
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
smi() { command -v nvidia-smi > /dev/null && nvidia-smi "$@"; }
smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
skip verify || qw_verify verify

gen_s=null convert_s=null
if [ ! -e "$MODEL_FP8/config.json" ]; then
  rm -rf "$MODEL_FP8"
  # An input whose conversion was cut short has lost its config.json (the
  # converter removes it first with --delete-input): write it again.
  [ -e "$MODEL/config.json" ] || rm -rf "$MODEL"
  t0=$(now)
  qw_checkpoint
  gen_s=$(since "$t0")
  echo "== BF16 checkpoint: $(du -sh "$MODEL" | cut -f1) in $gen_s s; $(df -h "$MODEL" | awk 'NR==2 { print $6 }'): $(df -h "$MODEL" | awk 'NR==2 { print $3 " used, " $4 " free" }')"
  t0=$(now)
  del=--delete-input
  [ -n "${KEEP_BF16:-}" ] && del=
  "$PYTHON" scripts/device/fp8_checkpoint.py "$MODEL" "$MODEL_FP8" $del > "$OUT/convert.log" 2>&1 \
    || { echo "convert: failed"; tail "$OUT/convert.log"; exit 1; }
  convert_s=$(since "$t0")
  echo "== FP8 checkpoint: $(du -sh "$MODEL_FP8" | cut -f1) in $convert_s s"
  tail -1 "$OUT/convert.log"
fi
skip serve && exit $rc
fp8_bytes=$(du -sb "$MODEL_FP8" | cut -f1)

MODEL=$MODEL_FP8
t0=$(now)
qw_serve "$OUT/serve-fp8.log"
trap 'kill $SRV 2>/dev/null; wait $SRV 2>/dev/null' EXIT
ready_s=$(since "$t0")
weights=$(grep -m1 "weights on the GPU" "$OUT/serve-fp8.log")
loaded=$(grep -m1 -o "model loaded in [0-9.]* s" "$OUT/serve-fp8.log")
gpu_mib=$(smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
echo "== served: ready in $ready_s s ($loaded); ${weights:-no weights line}; GPU memory in use ${gpu_mib:-?} MiB"
cat > "$OUT/fp8-load.json" << EOF
{
  "model": "$MODEL_FP8",
  "checkpoint_bytes": $fp8_bytes,
  "gen_bf16_s": $gen_s,
  "convert_s": $convert_s,
  "serve_ready_s": $ready_s,
  "server_log_load": "$loaded",
  "server_log_weights": "$(echo "$weights" | sed 's/"/\\"/g')",
  "gpu_memory_used_mib_after_load": ${gpu_mib:-null}
}
EOF

if ! skip bench; then
  echo "== serving at $CONC"
  "$BIN" bench --workload serving --url $URL --concurrency "$CONC" --prompt-tokens "$PROMPT" \
    --output-tokens "$TOKENS" --out "$OUT/serving-fp8.json" 2>&1 | grep -v "^\[bench\] request" | tail -12 || rc=1
fi
exit $rc
