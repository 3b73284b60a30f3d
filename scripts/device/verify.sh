#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a release build carried in
# (cargo build --release -p qwasi --features cuda):
#   1. `qwasi verify --backend cuda` on every fixture, with cuBLAS and with the
#      portable tiled GEMM for prefill;
#   2. a synthetic full-geometry Qwen3.6-35B-A3B smoke test (load, prefill,
#      prefill-vs-decode agreement, 16 decoded tokens, finite logits);
#   3. compute-sanitizer memcheck over one small fixture.
# Results land in $OUT (or /tmp/qwasi-out).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-target/release/qwasi}
V="$BIN verify"
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== verify (default: cuBLAS prefill GEMMs on split hi/lo bf16 activations)"
QWASI_GPU_DEBUG=${QWASI_GPU_DEBUG:-1} $V --backend cuda --json "$OUT/verify-split.json" 2>&1 | tee "$OUT/verify-split.log" || rc=1
echo "== info only: cuBLAS on bf16-rounded activations (QWASI_GEMM=bf16; expected to be less accurate)"
QWASI_GEMM=bf16 $V --backend cuda 2>&1 | tee "$OUT/verify-bf16.log"
echo "== verify (tiled f32-activation GEMM)"
QWASI_GEMM=tiled $V --backend cuda --json "$OUT/verify-tiled.json" 2>&1 | tee "$OUT/verify-tiled.log" || rc=1
echo "== synthetic qwen3.6-35b-a3b smoke"
$V --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b --prompt-len ${SMOKE_PROMPT:-1000} --gen-tokens 16 \
  --json "$OUT/smoke.json" 2>&1 | tee "$OUT/smoke.log" || rc=1
if command -v compute-sanitizer >/dev/null && [ "${SANITIZE:-1}" = 1 ]; then
  echo "== compute-sanitizer memcheck (moe-flat)"
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 $V --backend cuda \
    --model tests/fixtures/models/moe-flat 2>&1 | tail -40 | tee "$OUT/sanitizer.log" || rc=1
fi
exit $rc
