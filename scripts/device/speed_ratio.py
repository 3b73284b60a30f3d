#!/usr/bin/env python3
"""Adds transformers' numbers and our ratio to a `qwasi bench --workload speed` report.

    python3 scripts/device/speed_ratio.py SPEED_JSON HF_JSON

SPEED_JSON is the engine's report (`bench.sh`: $OUT/speed.json), HF_JSON the
report of scripts/device/hf_bench.py on the same weights and prompts
($OUT/hf.json). For every prompt length in both, the medians of TTFT and decode
tok/s side by side and the ratios; written back into SPEED_JSON as
`transformers` (the whole HF report) and `comparison`, and printed as a table.
`bench.sh` runs it when HF=1, so one bench run records both and the ratio.
"""
import json
import sys
from pathlib import Path


def comparison(speed: dict, hf: dict) -> list:
    theirs = {c["len"]: c for c in hf.get("cases", [])}
    rows = []
    for r in speed.get("results", []):
        c = theirs.get(r["prompt_len"])
        if c is None:
            continue
        q_ttft, q_dec = r["ttft_ms"]["median"], r["decode_tok_per_s"]["median"]
        t_ttft, t_dec = c["ttft_s"]["median"] * 1e3, c["decode_tok_s"]["median"]
        rows.append({
            "prompt_len": r["prompt_len"],
            "qwasi_ttft_ms": q_ttft,
            "transformers_ttft_ms": t_ttft,
            "qwasi_decode_tok_per_s": q_dec,
            "transformers_decode_tok_per_s": t_dec,
            "decode_speedup": q_dec / t_dec,
            "ttft_ratio_qwasi_over_transformers": q_ttft / t_ttft,
        })
    return rows


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    speed_path, hf_path = Path(sys.argv[1]), Path(sys.argv[2])
    speed = json.loads(speed_path.read_text())
    hf = json.loads(hf_path.read_text())
    rows = comparison(speed, hf)
    if not rows:
        print("speed_ratio: no prompt length in both reports", file=sys.stderr)
        return 1
    speed["transformers"] = hf
    speed["comparison"] = rows
    speed_path.write_text(json.dumps(speed, indent=2))
    print(f"{'len':>7} {'TTFT ms qwasi':>14} {'transformers':>13} {'decode tok/s qwasi':>19} "
          f"{'transformers':>13} {'decode x':>9}")
    for r in rows:
        print(f"{r['prompt_len']:>7} {r['qwasi_ttft_ms']:>14.1f} {r['transformers_ttft_ms']:>13.1f} "
              f"{r['qwasi_decode_tok_per_s']:>19.1f} {r['transformers_decode_tok_per_s']:>13.2f} "
              f"{r['decode_speedup']:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
