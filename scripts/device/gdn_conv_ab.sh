#!/usr/bin/env bash
# On the GPU machine, from the repository root: the GDN decode conv folded into
# the in projection (default) against its own kernel (QWASI_GDN_CONV=kernel)
# in one binary (QWASI_BIN), and optionally against an earlier build
# (QWASI_BIN_BASE), alternating for $ROUNDS rounds so drift spreads over all.
# Each binary passes `qwasi verify --synthetic` first (the reference fixtures,
# then the 40-layer synthetic model's prompt and decode paths against each
# other). Output: $OUT/gdn-conv-ab/ (verify logs, bench JSON per run).
#   LENS (512,8192), ROUNDS (2)
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
R=$OUT/gdn-conv-ab
mkdir -p "$R"
B=${QWASI_BIN:-target/release/qwasi}
BASE=${QWASI_BIN_BASE:-}
rc=0
verify() {
  timeout 300 env "$@" verify --backend cuda --synthetic qwen3.6-35b-a3b --prompt-len 300 --gen-tokens 16 \
    > "$R/verify-$n.txt" 2>&1 || rc=1
  echo "verify $n: $(tail -1 "$R/verify-$n.txt")"
}
n=fold; verify "$B"
n=kernel; verify QWASI_GDN_CONV=kernel "$B"
[ -n "$BASE" ] && { n=base; verify "$BASE"; }
variants="kernel fold"
[ -n "$BASE" ] && variants="base $variants"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in $variants; do
    case $v in
      base) cmd=("$BASE") ;;
      kernel) cmd=(env QWASI_GDN_CONV=kernel "$B") ;;
      fold) cmd=("$B") ;;
    esac
    "${cmd[@]}" bench --workload speed --backend cuda --lens "${LENS:-512,8192}" --decode-tokens 128 \
      --runs 5 --warmups 2 --fixtures /nonexistent --out "$R/ab-$round-$v.json" > "$R/ab-$round-$v.log" 2>&1 || rc=1
    echo "round $round $v: $(grep -E '^\[bench\] L' "$R/ab-$round-$v.log" | grep -oE 'L +[0-9]+: TTFT +[0-9.]+ ms, decode +[0-9.]+ tok/s' | tr '\n' ' ')"
  done
done
echo "exit $rc"
exit $rc
