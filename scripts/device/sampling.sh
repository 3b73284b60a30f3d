#!/usr/bin/env bash
# On the GPU machine, from the repository root (QWASI_BIN: a `--features cuda`
# build): the sampling readout (Backend::forward_top, kernels/sampling.cu).
#   1. `qwasi verify --synthetic` (8 layers, then all 40): a twin sequence read
#      through forward_top must give the host's top_logits of every step's
#      full logits, bit for bit (and the other smoke checks);
#   2. `qwasi bench --workload speed` at $LENS (fixtures first): greedy, and
#      sampled decode with top-k 20 read on the device vs top-p on the host.
# Everything lands in $OUT/sampling.tgz (one file: the device returns few).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
B=${QWASI_BIN:-target/release/qwasi}
R=/tmp/qwasi-sampling
rm -rf $R && mkdir -p $R $OUT
rc=0
for layers in 8 40; do
  echo "== verify --synthetic, $layers layers"
  $B verify --backend cuda --no-fixtures --synthetic qwen3.6-35b-a3b --layers $layers --prompt-len 1000 \
    --gen-tokens 32 --json $R/verify-synthetic-$layers.json > $R/verify-$layers.log 2>&1 || rc=1
  tail -2 $R/verify-$layers.log | cut -c1-600
done
echo "== bench speed ${LENS:-512,8192}"
$B bench --workload speed --backend cuda --lens "${LENS:-512,8192}" --decode-tokens 128 --runs "${RUNS:-5}" \
  --warmups 2 --out $R/speed.json > $R/speed.log 2>&1 || rc=1
grep -E "fixtures:|\] L " $R/speed.log
tar czf $OUT/sampling.tgz -C /tmp qwasi-sampling
echo "exit $rc"
exit $rc
