#!/usr/bin/env bash
# On the GPU machine, from the repository root: FP8 weights (issue 28) with the
# correctness checks of the same binary, in order of importance so that a call
# cut short still returns the first results:
#   1. `qwasi verify --backend cuda` on every fixture (the FP8 fixture both as
#      kept quantized and dequantized at upload), $OUT/verify.json;
#   2. batch-1 speed of the synthetic FP8 model (`qwen3.6-35b-a3b-fp8`, weights
#      kept FP8) at $LENS, $OUT/speed-fp8.json;
#   3. the same model dequantized at upload (QWASI_FP8=dequantize: the bf16
#      model's kernels and memory) in the same lease, $OUT/speed-bf16.json;
#   4. `verify --synthetic qwen3.6-35b-a3b-fp8` at 40 layers (prompt vs decode,
#      batched vs alone at full geometry), $OUT/verify-synthetic.json;
#   5. the batched engine on the FP8 model at $BATCHES, $OUT/batch-fp8.json.
# Each step runs under its own timeout ($STEP_S, default 150 s).
# Env: QWASI_BIN (.dev/qwasi), LENS (512,8192), BATCHES (8,64), SKIP (steps to skip, e.g. "3 5").
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=$(readlink -f "${QWASI_BIN:-.dev/qwasi}")
T="timeout ${STEP_S:-150}"
SYN="--backend cuda --synthetic qwen3.6-35b-a3b-fp8 --fixtures /nonexistent"
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if ! skip 1; then
  $T "$BIN" verify --backend cuda --json "$OUT/verify.json" > "$OUT/verify.log" 2>&1 || rc=1
  grep -E "FP8 kept|last logits|^(PASS|FAIL)|verdict|FAIL" "$OUT/verify.log" | tail -12
  echo "verify: $(tail -1 "$OUT/verify.log")"
fi
speed() { # name, env...
  local name=$1; shift
  env "$@" $T "$BIN" bench --workload speed $SYN --lens "${LENS:-512,8192}" --decode-tokens 128 \
    --runs 3 --warmups 1 --out "$OUT/speed-$name.json" > "$OUT/speed-$name.log" 2>&1 || rc=1
  echo "== speed $name"; grep -iE "weights|GB|tok/s|TTFT|error" "$OUT/speed-$name.log" | tail -8
}
skip 2 || speed fp8 QWASI_FP8=resident
skip 3 || speed bf16 QWASI_FP8=dequantize
if ! skip 4; then
  $T "$BIN" verify --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b-fp8 --layers 40 --prompt-len 1000 \
    --gen-tokens 16 --json "$OUT/verify-synthetic.json" > "$OUT/verify-synthetic.log" 2>&1 || rc=1
  echo "verify --synthetic fp8: $(tail -1 "$OUT/verify-synthetic.log")"
fi
if ! skip 5; then
  $T "$BIN" bench --workload batch $SYN --layers 40 --lens 1024 --decode-tokens 16 --batches "${BATCHES:-8,64}" \
    --out "$OUT/batch-fp8.json" > "$OUT/batch-fp8.log" 2>&1 || rc=1
  grep -E "^\[bench\] [0-9]+ prompt|error" "$OUT/batch-fp8.log"
fi
exit $rc
