#!/usr/bin/env bash
# On the GPU machine, from the repository root (see scripts/device/verify.sh):
#   1. scripts/device/verify.sh (fixtures, synthetic smoke, sanitizer);
#   2. full-width reduced-depth comparison against transformers in float32 on the
#      same bf16 weights: scripts/device/compare_transformers.py writes the model
#      and the reference, then `verify --compare` runs the GPU backend on it.
# $OUT gets: verify-{split,tiled,kvbf16}.json smoke.json compare-<kv>.json run.log
# Env: LAYERS (8), LENS (1,1024,8192), GEN (64), ATTN (eager; chunked for >16K), KV_MODES ("f32 bf16"), SKIP_VERIFY.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-target/release/qwasi}
V="$BIN verify"
rc=0
{
  if [ -z "${SKIP_VERIFY:-}" ]; then
    OUT=/tmp/qwasi-verify QWASI_BIN=$BIN bash scripts/device/verify.sh || rc=1
    for f in verify-split.json verify-tiled.json smoke.json; do cp /tmp/qwasi-verify/$f "$OUT/" 2>/dev/null; done
    echo "== verify with a bf16 KV cache (QWASI_KV=bf16)"
    QWASI_KV=bf16 $V --backend cuda --json "$OUT/verify-kvbf16.json" || rc=1
  fi
  echo "== transformers float32 reference (${LAYERS:-8} layers, full width)"
  W=${REF_DIR:-/tmp/qwasi-ref}
  PYTHONUNBUFFERED=1 python3 scripts/device/compare_transformers.py "$W" --layers ${LAYERS:-8} \
    --lens ${LENS:-1,1024,8192} --gen ${GEN:-64} --attn ${ATTN:-eager} || rc=1
  for kv in ${KV_MODES:-f32 bf16}; do
    echo "== GPU backend (KV cache $kv) vs transformers"
    QWASI_KV=$kv $V --compare "$W" --json "$OUT/compare-$kv.json" || rc=1
  done
  echo "exit $rc"
  exit $rc
} 2>&1 | tee "$OUT/run.log"
exit ${PIPESTATUS[0]}
