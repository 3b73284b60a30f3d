#!/usr/bin/env python3
"""One benchmark record from a `scripts/device/serving.sh` output folder.

    python3 scripts/device/serving_report.py DIR OUT.json --command "..." [--note "..."]

Every `qwasi bench --workload serving` report in DIR (serving*.json,
long*.json) goes under `runs` by file stem with its levels cut to the figures
the docs quote; `verify.json` (the same binary's `qwasi verify`, where the call ran it)
and each bench's own fixture check become `correctness`, and `metrics-after.txt` is kept. Fails when the fixtures or
any bench's own fixture check did not pass, since no speed number stands
without the correctness check of its build.
"""
import argparse
import json
import pathlib
import sys

KEEP = ("concurrency", "request_rate", "prompt_tokens", "requests", "failed", "output_tok_per_s",
        "ttft_ms", "itl_ms", "tpot_ms", "preemptions", "engine_steps")


def level(row):
    out = {k: row[k] for k in KEEP if k in row}
    for k in ("ttft_ms", "itl_ms", "tpot_ms"):
        if isinstance(out.get(k), dict):
            out[k] = {q: round(v, 2) for q, v in out[k].items() if q in ("p50", "p99", "max")}
    if "output_tok_per_s" in out:
        out["output_tok_per_s"] = round(out["output_tok_per_s"], 1)
    steps = out.get("engine_steps")
    if isinstance(steps, dict):
        out["engine_steps"] = {
            k: ({"steps": int(v["steps"]), "mean_ms": round(v["mean_ms"], 2)} if isinstance(v, dict) else round(v, 3))
            for k, v in steps.items()
        }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--command", required=True)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    d = pathlib.Path(a.dir)
    vf = d / "verify.json"
    verify = json.loads(vf.read_text()) if vf.exists() else None
    runs, commit, gpu, checks = {}, None, None, []
    for f in sorted(d.glob("*.json")):
        if f.name == "verify.json":
            continue
        r = json.loads(f.read_text())
        if r.get("workload") != "serving":
            continue
        commit, gpu = r.get("commit"), r.get("gpu")
        checks.append(r.get("correctness", {}).get("pass"))
        runs[f.stem] = [level(x) for x in r.get("levels", [])]
    if (verify is not None and not verify.get("pass")) or not checks or not all(checks):
        sys.exit(f"correctness did not pass (verify {verify and verify.get('pass')}, bench checks {checks}): no report")
    metrics = d / "metrics-after.txt"
    rec = {
        "workload": "serving",
        "commit": commit,
        "gpu": gpu,
        "command": a.command,
        "note": a.note,
        "correctness": {
            "verify": "PASS" if verify else "not run in this call",
            "verify_cases": len(verify.get("cases", [])) if verify else 0,
            "bench_fixture_checks": f"{len(checks)} PASS",
        },
        "runs": runs,
        "metrics_after": metrics.read_text().splitlines() if metrics.exists() else None,
    }
    pathlib.Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")


if __name__ == "__main__":
    main()
