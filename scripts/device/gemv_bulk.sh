#!/usr/bin/env bash
# On the GPU machine, from the repository root (QWASI_BIN: a `--features cuda`
# build): the bulk-copy decode GEMVs (kernels/gemv_bulk.cu) against the
# split-row ones they replace.
#   1. `qwasi verify --synthetic` (8 layers): prefill vs prefill + decode at
#      the full geometry, every decode GEMV through the bulk kernels;
#   2. compute-sanitizer memcheck of one fixture's decode (when installed);
#   3. `qwasi bench --workload speed` at $LENS with the fixtures (default path);
#   4. the same without fixtures for QWASI_GEMV=rows (the previous kernels)
#      and ring shapes (QWASI_BULK_STAGES, QWASI_BULK_BLOCKS);
#   5. `bench --probe` (one 16.8 MB matrix per launch) for both paths.
# Everything lands in $OUT/gemv_bulk.tgz (one file: the device returns few).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
B=${QWASI_BIN:-target/release/qwasi}
R=/tmp/qwasi-gemv-bulk
rm -rf $R && mkdir -p $R $OUT
rc=0
LENS=${LENS:-512,8192}
echo "== verify --synthetic, 8 layers"
$B verify --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b --layers 8 --prompt-len 1000 \
  --gen-tokens 32 --json $R/verify-synthetic-8.json > $R/verify-8.log 2>&1 || rc=1
tail -2 $R/verify-8.log | cut -c1-400
if command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck (moe-flat)"
  timeout 200 compute-sanitizer --tool memcheck --print-limit 10 $B verify --backend cuda \
    --model tests/fixtures/models/moe-flat > $R/sanitizer.log 2>&1 || rc=1
  tail -4 $R/sanitizer.log
fi
echo "== bench speed $LENS (fixtures, default path)"
$B bench --workload speed --backend cuda --lens "$LENS" --decode-tokens 128 --runs "${RUNS:-5}" \
  --warmups 2 --out $R/speed.json > $R/speed.log 2>&1 || rc=1
grep -E "fixtures:|\] L " $R/speed.log | cut -c1-300
for v in "QWASI_GEMV=rows" ${VARIANTS:-"QWASI_BULK_STAGES=2" "QWASI_BULK_STAGES=4" "QWASI_BULK_STAGES=2 QWASI_BULK_BLOCKS=2"}; do
  name=$(echo "$v" | tr ' =' '_-')
  echo "== $v"
  env $v $B bench --workload speed --backend cuda --lens "$LENS" --decode-tokens 128 --runs 3 --warmups 1 \
    --fixtures /nonexistent --out $R/speed-$name.json > $R/speed-$name.log 2>&1 || rc=1
  grep -E "\] L " $R/speed-$name.log | cut -c1-300
done
for v in "" "QWASI_GEMV=rows"; do
  echo "== probe $v"
  env $v $B bench --workload speed --backend cuda --lens 512 --decode-tokens 8 --runs 1 --warmups 0 \
    --fixtures /nonexistent --probe --out $R/probe-${v:-bulk}.json 2>&1 | grep -i probe | head -3
done
tar czf $OUT/gemv_bulk.tgz -C /tmp qwasi-gemv-bulk
echo "exit $rc"
exit $rc
