#!/usr/bin/env bash
# On the GPU machine, from the repository root: one binary (QWASI_BIN) under
# several environment settings, each a `qwasi bench --workload speed` run
# (the reference fixtures first, then TTFT and greedy decode at $LENS), so
# that a switch such as QWASI_MOE_BK64=32 is compared with the default in
# one session. The runs alternate (A B A B ...) $ROUNDS times, which spreads
# the machine's drift over both.
#   VARIANTS (required): settings separated by ';', "-" for the default,
#             e.g. "-;QWASI_MOE_BK64=32"
#   LENS (512,8192), DECODE (128), RUNS (5), WARMUPS (2), ROUNDS (2)
# Output: $OUT/env-ab/<round>-<n>.json per run and summary.txt (decode tok/s
# and TTFT medians per setting and length).
set -uo pipefail
OUT=${OUT:-/tmp/qwasi-out}
R=$OUT/env-ab
mkdir -p "$R"
B=${QWASI_BIN:-target/release/qwasi}
IFS=';' read -r -a variants <<<"${VARIANTS:?set VARIANTS, e.g. VARIANTS='-;QWASI_MOE_BK64=32'}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$R/gpu.txt"
rc=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for n in "${!variants[@]}"; do
    v=${variants[$n]}
    env_args=()
    [ "$v" != "-" ] && read -r -a env_args <<<"$v"
    echo "== round $round: ${v}"
    env "${env_args[@]}" "$B" bench --workload speed --backend cuda --lens "${LENS:-512,8192}" \
      --decode-tokens "${DECODE:-128}" --runs "${RUNS:-5}" --warmups "${WARMUPS:-2}" \
      --out "$R/$round-$n.json" >"$R/$round-$n.log" 2>&1 || { rc=1; tail -5 "$R/$round-$n.log"; }
  done
done
python3 - "$R" "${variants[@]}" <<'EOF' | tee "$R/summary.txt"
import json, glob, os, sys
r, variants = sys.argv[1], sys.argv[2:]
for n, v in enumerate(variants):
    for f in sorted(glob.glob(os.path.join(r, f"*-{n}.json"))):
        d = json.load(open(f))
        ok = d.get("correctness", {}).get("pass")
        for x in d.get("results", []):
            print(f"{v:<28} {os.path.basename(f):<10} prompt {x.get('prompt_len'):>6}  "
                  f"decode {x['decode_tok_per_s']['median']:7.1f} tok/s  "
                  f"TTFT {x.get('ttft_ms', {}).get('median', float('nan')):8.1f} ms  fixtures {ok}")
EOF
echo "exit $rc"
exit $rc
