#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a qwasi binary built with
# `--features cuda` carried in (QWASI_BIN, default target/release/qwasi):
#   1. `qwasi bench --workload speed`: the reference fixtures (correctness of
#      this build), then TTFT and greedy decode on the synthetic full-geometry
#      model at $LENS (default 512,8192), JSON report in $OUT/speed.json;
#   2. with PROFILE=1 (default): the same at $PROFILE_LEN with per-kernel GPU
#      times (QWASI_GPU_PROFILE=1: event pairs around every launch, no graphs)
#      in $OUT/profile.json;
#   3. with HF=1: transformers on the same synthetic weights
#      (scripts/device/hf_bench.py; wheels in .whl carried), $OUT/hf.json,
#      then both side by side with the ratios added to $OUT/speed.json
#      (`transformers`, `comparison`; scripts/device/speed_ratio.py).
# Env: LENS, DECODE (128), RUNS (5), WARMUPS (2), EXTRA (more bench flags, e.g.
# --ttft-max 131072 to time long prompts 2 + 5 times too), HF_LENS (the
# transformers lengths, default $LENS).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-target/release/qwasi}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== qwasi bench --workload speed"
$BIN bench --workload speed --backend cuda --lens "${LENS:-512,8192}" \
  --decode-tokens "${DECODE:-128}" --runs "${RUNS:-5}" --warmups "${WARMUPS:-2}" \
  --dump-logits "${LOGITS_DIR:-/tmp/qwasi-logits}" --out "$OUT/speed.json" ${EXTRA:-} 2>&1 | tee "$OUT/speed.log" || rc=1
if [ "${PROFILE:-1}" = 1 ]; then
  echo "== per-kernel profile"
  QWASI_GPU_PROFILE=1 $BIN bench --workload speed --backend cuda --lens "${PROFILE_LEN:-8192}" \
    --decode-tokens 16 --runs 1 --warmups 0 --fixtures /nonexistent \
    --out "$OUT/profile.json" 2>&1 | tail -40 || rc=1
fi
if [ "${HF:-0}" = 1 ]; then
  echo "== transformers on the same weights"
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
  PYTHONUNBUFFERED=1 python3 scripts/device/hf_bench.py --lens "${HF_LENS:-${LENS:-512,8192}}" \
    --decode "${DECODE:-128}" --json "$OUT/hf.json" ${HF_EXTRA:-} 2>&1 | tee "$OUT/hf.log" || rc=1
  python3 scripts/device/speed_ratio.py "$OUT/speed.json" "$OUT/hf.json" || rc=1
fi
echo "exit $rc"
exit $rc
