#!/usr/bin/env bash
# On the GPU machine, from the repository root (QWASI_BIN: a `--features
# cuda,experiments` build; QWASI_DEC_SKIP is an error without `experiments`):
# what each stage of the decode step costs inside the CUDA graph.
# `bench --workload speed` at $LEN (default 8192) once with the full step and
# once per stage left out (QWASI_DEC_SKIP: wrong tokens, measurement only);
# the difference in ms per token is that stage's in-graph cost, with its
# neighbours' overlap. Then the fixtures on the same binary (the full step).
# Everything lands in $R (default /tmp/qwasi-ablation) and $OUT/ablation.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
B=${QWASI_BIN:-target/release/qwasi}
R=${R:-/tmp/qwasi-ablation}
rm -rf $R && mkdir -p $R $OUT
LEN=${LEN:-8192}
# in_proj includes the GDN conv where it is folded in (the default on sm_90;
# with QWASI_GDN_CONV=kernel it is the gdn_prep stage).
STAGES=${STAGES:-"none in_proj gdn_prep gdn_step out_proj attn_proj attn_prep attn attn_combine o_proj moe_input moe_gate_up moe_down lm_head attn_prep,attn,attn_combine"}
for s in $STAGES; do
  QWASI_DEC_SKIP=$s $B bench --workload speed --backend cuda --lens $LEN --decode-tokens 128 --runs 3 --warmups 1 \
    --fixtures /nonexistent --out $R/skip-$s.json > $R/skip-$s.log 2>&1
  echo "skip $s: $(grep -E '\] L ' $R/skip-$s.log | grep -oE 'decode +[0-9.]+ tok/s')"
done
echo "== fixtures (full step)"
$B verify --backend cuda > $R/fixtures.log 2>&1; tail -1 $R/fixtures.log
tar czf $OUT/ablation.tgz -C "$(dirname "$R")" "$(basename "$R")"
