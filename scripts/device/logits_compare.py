#!/usr/bin/env python3
"""Compares the logits two `qwasi bench --dump-logits DIR` runs wrote (same
lengths, e.g. two decode-attention kernels of one binary): per file, whether
they are bit-identical, the largest |difference|, KL(a || b) of the softmax
distributions and whether the argmax agrees. Prints JSON; exit 1 if a file
is missing on one side or KL exceeds --max-kl."""
import argparse
import json
import math
import os
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def log_softmax(x):
    m = max(x)
    lse = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - lse for v in x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--max-kl", type=float, default=1e-4)
    o = ap.parse_args()
    out, ok = {}, True
    for name in sorted(set(os.listdir(o.a)) | set(os.listdir(o.b))):
        pa, pb = os.path.join(o.a, name), os.path.join(o.b, name)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            out[name] = "missing on one side"
            ok = False
            continue
        x, y = load(pa), load(pb)
        la, lb = log_softmax(x), log_softmax(y)
        kl = sum(math.exp(p) * (p - q) for p, q in zip(la, lb))
        out[name] = {
            "bit_identical": x == y,
            "max_abs_diff": max(abs(p - q) for p, q in zip(x, y)),
            "kl": kl,
            "argmax_agree": x.index(max(x)) == y.index(max(y)),
        }
        ok &= kl <= o.max_kl
    print(json.dumps({"a": o.a, "b": o.b, "max_kl": o.max_kl, "files": out, "pass": ok}, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
