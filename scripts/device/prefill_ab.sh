#!/usr/bin/env bash
# On the GPU machine, from the repository root: the prompt path of a build
# (QWASI_BIN) against a base build (QWASI_BIN_BASE, optional) in one session.
#   1. the new build's correctness: `verify --synthetic` (the reference
#      fixtures against transformers, then the 40-layer synthetic geometry's
#      prefill vs decode agreement);
#   2. per-kernel prompt times at $PROFILE_LEN (QWASI_GPU_PROFILE=1), each build;
#   3. `bench --workload speed` at $LENS (TTFT 2 + 5 runs, with the fixtures
#      of the same binary; decode $DECODE tokens), each build, with the last
#      logits of every length dumped for scripts/device/logits_compare.py;
#   4. with LONG=1: the 131,072-token TTFT (2 + $LONG_RUNS runs), new build.
# Everything lands in $OUT/prefill.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
R=/tmp/qwasi-prefill
rm -rf $R && mkdir -p $R $OUT
NEW=${QWASI_BIN:-target/release/qwasi}
OLD=${QWASI_BIN_BASE:-}
LENS=${LENS:-512,8192,32768}
DECODE=${DECODE:-32}
PROFILE_LEN=${PROFILE_LEN:-8192}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee $R/gpu.txt
echo "== verify --synthetic (new)"
timeout 240 $NEW verify --backend cuda --synthetic qwen3.6-35b-a3b --json $R/verify.json > $R/verify.log 2>&1
echo "verify exit $?"; grep -E "PASS|FAIL" $R/verify.log | cut -c1-120
builds="new"; [ -n "$OLD" ] && builds="new old"
for b in $builds; do
  B=$NEW; [ $b = old ] && B=$OLD
  echo "== profile $b at $PROFILE_LEN"
  QWASI_GPU_PROFILE=1 timeout 120 $B bench --workload speed --backend cuda --lens $PROFILE_LEN --decode-tokens 16 \
    --runs 1 --warmups 0 --fixtures /nonexistent --out $R/profile-$b.json > $R/profile-$b.log 2>&1
  python3 - $R/profile-$b.json <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
top = sorted(r["prefill_profile_ms"], key=lambda k: -k["ms"])[:12]
print("  prefill kernels, ms:", ", ".join(f'{k["kernel"]} {k["ms"]:.1f}' for k in top))
EOF
  echo "== speed $b at $LENS"
  timeout 200 $B bench --workload speed --backend cuda --lens $LENS --decode-tokens $DECODE --runs 5 --warmups 2 --ttft-max 32768 \
    --dump-logits $R/logits-$b --out $R/speed-$b.json > $R/speed-$b.log 2>&1
  grep -E "\] L |fixtures" $R/speed-$b.log | cut -c1-140
done
if [ -n "$OLD" ]; then
  echo "== logits new vs old"
  python3 scripts/device/logits_compare.py $R/logits-new $R/logits-old > $R/logits-compare.json; tail -c 600 $R/logits-compare.json
fi
if [ "${LONG:-0}" = 1 ]; then
  echo "== 131K TTFT (new)"
  timeout 200 $NEW bench --workload speed --backend cuda --lens 131072 --ttft-max 131072 --decode-tokens 8 \
    --runs ${LONG_RUNS:-3} --warmups 1 --fixtures /nonexistent --out $R/speed-131k-new.json > $R/speed-131k-new.log 2>&1
  grep -E "\] L " $R/speed-131k-new.log | cut -c1-140
fi
tar czf $OUT/prefill.tgz -C /tmp qwasi-prefill
