#!/usr/bin/env bash
# On the GPU machine, from the repository root: every kernel of the batched
# decode step under Nsight Compute (issue 23). `qwasi bench --workload
# batch` opens the profiler's range around its timed steps only, so ncu
# (`--profile-from-start off`) sees whole steps and nothing of the prompts
# or the checks before them; scripts/device/ncu_steps.py sums them per kernel.
# Env: QWASI_BIN (.dev/qwasi), NCU_BATCHES (8 64), NCU_STEPS (2), NCU_ENV
# (VAR=value ... for the profiled runs), OUT.
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=$(readlink -f "${QWASI_BIN:-.dev/qwasi}")
SYN="--backend cuda --synthetic qwen3.6-35b-a3b --layers 40 --lens 1024 --fixtures /nonexistent"
rc=0
for bs in ${NCU_BATCHES:-8 64}; do
  env ${NCU_ENV:-} ncu --profile-from-start off --clock-control none --cache-control none \
    --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    "$BIN" bench --workload batch $SYN --decode-tokens "${NCU_STEPS:-2}" --batches "$bs" \
    --out "/tmp/ncu-bench-$bs.json" > "$OUT/ncu-b$bs.csv" 2> "/tmp/ncu-b$bs.err" || { rc=1; tail -5 "/tmp/ncu-b$bs.err"; }
  echo "== B=$bs"
  python3 scripts/device/ncu_steps.py "$OUT/ncu-b$bs.csv" --top "${NCU_TOP:-32}" || rc=1
done
exit $rc
