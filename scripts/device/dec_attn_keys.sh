#!/usr/bin/env bash
# On the GPU machine, from the repository root (QWASI_BIN: a `--features cuda`
# build): the key-parallel decode attention (`QWASI_DEC_ATTN=keys|keys1`,
# kernels/decode_attn_keys.cu) against the default kernels, one binary:
#   1. for each path: the fixtures (correctness with that kernel on every decode
#      step) and decode at $LENS (512,8192), $OUT/speed-<path>.json;
#   2. for each path: $LONG (32768,131072), one run of 32 tokens with the logits
#      dumped, $OUT/long-<path>.json; then the dumped logits of each path against
#      the default's (scripts/device/logits_compare.py), $OUT/compare-<path>.json.
# About 6 minutes. Env: PATHS (default keys keys1), LENS, LONG, RUNS (5).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
export QWASI_BIN=${QWASI_BIN:-target/release/qwasi}
rc=0
for p in default ${PATHS:-keys keys1}; do
  if [ "$p" = default ]; then unset QWASI_DEC_ATTN; else export QWASI_DEC_ATTN=$p; fi
  echo "== $p: fixtures + ${LENS:-512,8192}"
  OUT=/tmp/qwasi-run LENS=${LENS:-512,8192} RUNS=${RUNS:-5} PROFILE=0 LOGITS_DIR=/tmp/logits-short-$p \
    bash scripts/device/bench.sh > "$OUT/$p.log" 2>&1 || rc=1
  cp /tmp/qwasi-run/speed.json "$OUT/speed-$p.json" 2>/dev/null || rc=1
  grep -E "fixture|PASS|FAIL|tok/s" "$OUT/$p.log" | tail -14
  echo "== $p: ${LONG:-32768,131072}"
  OUT=/tmp/qwasi-run LENS=${LONG:-32768,131072} RUNS=1 WARMUPS=0 DECODE=32 PROFILE=0 \
    LOGITS_DIR=/tmp/logits-long-$p EXTRA="--fixtures /nonexistent" \
    bash scripts/device/bench.sh > "$OUT/$p-long.log" 2>&1 || rc=1
  cp /tmp/qwasi-run/speed.json "$OUT/long-$p.json" 2>/dev/null || rc=1
  grep -E "tok/s" "$OUT/$p-long.log" | tail -4
  if [ "$p" != default ]; then
    for len in short long; do
      python3 scripts/device/logits_compare.py /tmp/logits-$len-default /tmp/logits-$len-$p \
        > "$OUT/compare-$p-$len.json" || rc=1
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$p $len', {k: (v if isinstance(v, str) else (v['kl'], v['argmax_agree'])) for k, v in d['files'].items()}, 'pass', d['pass'])" "$OUT/compare-$p-$len.json"
    done
  fi
done
echo "exit $rc"
exit $rc
