#!/usr/bin/env python3
"""Summarises an `ncu --csv --page raw` log of whole decode steps (one row per
kernel, `--profile-from-start off` around the timed steps of `qwasi bench`):
per kernel name the launches and GPU time per step, the DRAM bytes read and
the rate they were read at, and the sum over the step. Steps are counted by
`STEP_FIRST`, the step's first kernel (the embedding gather).

    ncu_steps.py LOG.csv [--top N]
"""
import csv
import io
import sys
from collections import defaultdict

STEP_FIRST = "embed_gather"


def rows(path):
    text = open(path, errors="replace").read()
    # ncu prints its own lines before the CSV header.
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV found")
    r = list(csv.DictReader(io.StringIO(text[start:])))
    # The second row holds the units.
    return [x for x in r if x.get("ID", "").isdigit()]


def num(x, key):
    v = x.get(key, "").replace(",", "")
    try:
        return float(v)
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 30
    r = rows(path)
    steps = max(1, sum(1 for x in r if x["Kernel Name"].startswith(STEP_FIRST)))
    agg = defaultdict(lambda: [0, 0.0, 0.0])
    for x in r:
        name = x["Kernel Name"].split("(")[0].split("<")[0].strip()
        a = agg[name]
        a[0] += 1
        a[1] += num(x, "gpu__time_duration.sum")  # ns
        a[2] += num(x, "dram__bytes_read.sum")  # bytes
    tot_t = sum(a[1] for a in agg.values()) / steps
    tot_b = sum(a[2] for a in agg.values()) / steps
    # bytes / ns = GB/s; / 1e3: TB/s.
    print(f"{steps} steps, {len(r) / steps:.0f} launches a step: kernels {tot_t / 1e6:.3f} ms, "
          f"{tot_b / 1e9:.2f} GB read ({tot_b / tot_t / 1e3:.2f} TB/s over the kernels' time)")
    print(f"{'kernel':32s} {'n/step':>7s} {'ms/step':>8s} {'us/launch':>9s} {'GB/step':>8s} {'TB/s':>6s}")
    for name, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{name:32s} {n / steps:7.1f} {t / steps / 1e6:8.3f} {t / n / 1e3:9.2f} "
              f"{b / steps / 1e9:8.3f} {b / t / 1e3 if t else 0:6.2f}")


if __name__ == "__main__":
    main()
