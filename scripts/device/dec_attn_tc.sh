#!/usr/bin/env bash
# On the GPU machine, from the repository root (QWASI_BIN: a `--features cuda`
# build): the feeds of the tensor-core decode attention (kernels/decode_attn_tc.cu),
# one binary, each forced with QWASI_DEC_ATTN:
#   tc: fragments read from global memory into registers (one tile ahead);
#   tc-ring2..4: through a cp.async ring of 2..4 slots per warp.
# For each: the fixtures (`qwasi verify`, every decode step with that kernel),
# then decode at $LENS (8192,32768,131072; one run of $DECODE tokens after a
# warm-up, logits dumped) into $OUT/tc-<path>.json, and the dumped logits
# against the first path's (scripts/device/logits_compare.py).
# Env: PATHS (default "tc tc-ring2 tc-ring3 tc-ring4"), LENS, DECODE (64).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-target/release/qwasi}
rc=0
first=
for p in ${PATHS:-tc tc-ring2 tc-ring3 tc-ring4}; do
  export QWASI_DEC_ATTN=$p
  echo "== $p"
  timeout 120 $BIN verify --backend cuda > "$OUT/verify-$p.log" 2>&1 || rc=1
  tail -1 "$OUT/verify-$p.log"
  timeout 300 $BIN bench --workload speed --backend cuda --lens "${LENS:-8192,32768,131072}" \
    --decode-tokens "${DECODE:-64}" --runs 1 --warmups 1 --fixtures /nonexistent \
    --dump-logits "/tmp/logits-$p" --out "$OUT/tc-$p.json" > "$OUT/bench-$p.log" 2>&1 || rc=1
  grep -E "tok/s" "$OUT/bench-$p.log"
  if [ -z "$first" ]; then first=$p; else
    python3 scripts/device/logits_compare.py "/tmp/logits-$first" "/tmp/logits-$p" > "$OUT/compare-$p.json" || rc=1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('$p vs $first: pass', d['pass'], {k: (v if isinstance(v, str) else (v['kl'], v['argmax_agree'])) for k, v in d['files'].items()})" "$OUT/compare-$p.json"
  fi
done
echo "exit $rc"
exit $rc
