#!/usr/bin/env bash
# On the GPU machine: long prompts. (1) transformers f32 comparison at full width,
# reduced depth, 32K tokens (sdpa attention for memory); (2) synthetic full-geometry
# smoke at 1K and 32K tokens (finite logits, prefill vs prefill+decode agreement,
# snapshot/restore identity). $OUT gets verify-final.json compare-f32.json smoke-*.json run.log long.log.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-target/release/qwasi}
V="$BIN verify"
rc=0
{
  echo "== fixtures (default settings)"
  $V --backend cuda --json "$OUT/verify-final.json" || rc=1
  OUT=$OUT SKIP_VERIFY=1 LENS=${LENS:-32768} ATTN=sdpa KV_MODES=f32 GEN=${GEN:-32} QWASI_BIN=$BIN \
    bash scripts/device/compare.sh > /tmp/compare.log 2>&1 || rc=1
  cat /tmp/compare.log
  for L in ${SMOKE_LENS:-1000 32768}; do
    echo "== synthetic qwen3.6-35b-a3b smoke, $L-token prompt"
    timeout ${SMOKE_TIMEOUT:-300} $V --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b --prompt-len $L \
      --gen-tokens 8 --json "$OUT/smoke-$L.json" || rc=1
  done
  echo "exit $rc"
  exit $rc
} 2>&1 | tee "$OUT/long.log"
exit ${PIPESTATUS[0]}
