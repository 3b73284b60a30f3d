#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a qwasi built with
# `--features cuda` (QWASI_BIN, default .dev/qwasi): the two prompt precisions
# of one binary (issue #27; docs/GPU.md "Numerics"), correctness and speed:
#   1. `qwasi verify --backend cuda`: the fixtures in the default mode (split);
#   2. scripts/device/compare_transformers.py --dtype both: transformers in
#      float32 and in bfloat16 on one full-width model of $LAYERS layers with
#      random bf16 weights, prompts of $LENS tokens; then `verify --compare`
#      with --prefill-precision split and bf16 (KL against both references,
#      and the yardstick KL(f32 || bf16) of transformers itself);
#   3. `qwasi bench --workload speed` on the synthetic 40-layer model at
#      $SPEED_LENS in both modes (the split run checks the fixtures first; the
#      bf16 run too, for information: the fixtures' tolerances are the split
#      mode's), and with PROFILE=1 the per-kernel prompt profile at 8K in both.
# Everything lands in $OUT/precision.tar.gz (and run.log beside it).
# Env: LAYERS (8), LENS (1024,8192,32768), GEN (16), ATTN (chunked), SPEED_LENS
# (1024,8192), RUNS (3), PROFILE (1), MOE_AB (0; 1: the bf16 profile with the
# other expert kernels, QWASI_MOE_GEMM=wg128 and mma, too), REF_DIR (/dev/shm/qwasi-ref), CT (the
# compare_transformers.py to run).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
BIN=${QWASI_BIN:-.dev/qwasi}
W=$OUT/precision
mkdir -p "$W"
rc=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$W/gpu.txt"
  echo "== verify (fixtures, default prompt precision: split)"
  "$BIN" verify --backend cuda --json "$W/verify-split.json" > "$W/verify-split.log" 2>&1 || rc=1
  tail -3 "$W/verify-split.log"
  echo "== transformers references, float32 and bfloat16 (${LAYERS:-8} layers, full width, lens ${LENS:-1024,8192,32768})"
  R=${REF_DIR:-/dev/shm/qwasi-ref}
  PYTHONUNBUFFERED=1 timeout ${REF_TIMEOUT:-330} python3 "${CT:-scripts/device/compare_transformers.py}" "$R" --layers ${LAYERS:-8} \
    --lens ${LENS:-1024,8192,32768} --gen ${GEN:-16} --attn ${ATTN:-chunked} --dtype both || rc=1
  for p in split bf16; do
    echo "== verify --compare, --prefill-precision $p"
    "$BIN" verify --backend cuda --compare "$R" --prefill-precision $p --json "$W/compare-$p.json" 2>&1 \
      | grep -v '^\[cuda\]' || rc=1
  done
  for p in split bf16; do
    echo "== bench speed, --prefill-precision $p"
    "$BIN" bench --workload speed --backend cuda --synthetic qwen3.6-35b-a3b --layers 40 \
      --lens ${SPEED_LENS:-1024,8192} --decode-tokens 32 --runs ${RUNS:-3} --warmups 1 \
      --prefill-precision $p --out "$W/speed-$p.json" > "$W/speed-$p.log" 2>&1 || rc=1
    grep -E "fixtures|ttft|TTFT|^ *[0-9]+ " "$W/speed-$p.log" | tail -6
  done
  if [ "${PROFILE:-1}" = 1 ]; then
    for p in split bf16; do
      echo "== per-kernel prompt profile at 8K, --prefill-precision $p"
      QWASI_GPU_PROFILE=1 "$BIN" bench --workload speed --backend cuda --synthetic qwen3.6-35b-a3b --layers 40 \
        --lens 8192 --decode-tokens 4 --runs 1 --warmups 0 --fixtures /nonexistent \
        --prefill-precision $p --out "$W/profile-$p.json" > "$W/profile-$p.log" 2>&1 || rc=1
    done
  fi
  if [ "${MOE_AB:-0}" = 1 ]; then
    for g in wg128 mma; do
      echo "== prompt profile at 8K, --prefill-precision bf16, QWASI_MOE_GEMM=$g"
      QWASI_MOE_GEMM=$g QWASI_GPU_PROFILE=1 "$BIN" bench --workload speed --backend cuda --synthetic qwen3.6-35b-a3b \
        --layers 40 --lens 8192 --decode-tokens 4 --runs 1 --warmups 0 --fixtures /nonexistent \
        --prefill-precision bf16 --out "$W/profile-bf16-$g.json" > "$W/profile-bf16-$g.log" 2>&1 || rc=1
    done
  fi
  echo "exit $rc"
  exit $rc
} 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
cp "$OUT/run.log" "$W/"
tar -C "$OUT" -czf "$OUT/precision.tar.gz" precision && rm -rf "$W"
exit $status
