#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a qwasi binary built with
# `--features cuda` carried in (QWASI_BIN, default target/release/qwasi):
# `qwasi bench --workload prefix-cache --backend cuda`: the reference fixtures
# (correctness of this build), then per prefix length in $PREFIXES the time to
# first token of a prompt of prefix + $NEW tokens cold vs resumed from the
# prefix's cached snapshot, on the synthetic full-geometry model, with the
# cached request's greedy tokens and logprobs checked against the cold one's.
# JSON report in $OUT/prefix-cache.json, log in $OUT/prefix-cache.log.
# Env: PREFIXES (8192,32768,131072), NEW (1024), RUNS (1), CACHE_MIB (32768),
# INTERVALS (snapshot-interval sweep; empty = none, the default), BACKEND
# (cuda), PRESET (qwen3.6-35b-a3b), EXTRA (more bench flags, e.g. --layers 8);
# QWASI_GPU_PROFILE=1 adds the cached request's per-kernel times (RUNS=2 keeps
# the exactness run's decode steps out of them).
# About 3 minutes at the defaults (a 131K cold prefill is ~1 minute, run twice).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
mkdir -p "$OUT"
BIN=${QWASI_BIN:-target/release/qwasi}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== qwasi bench --workload prefix-cache"
$BIN bench --workload prefix-cache --backend "${BACKEND:-cuda}" --synthetic "${PRESET:-qwen3.6-35b-a3b}" \
  --prefixes "${PREFIXES:-8192,32768,131072}" --new-tokens "${NEW:-1024}" --runs "${RUNS:-1}" \
  --intervals "${INTERVALS:-}" --prefix-cache-mib "${CACHE_MIB:-32768}" \
  --out "$OUT/prefix-cache.json" ${EXTRA:-} 2>&1 | tee "$OUT/prefix-cache.log" || rc=1
echo "exit $rc"
exit $rc
