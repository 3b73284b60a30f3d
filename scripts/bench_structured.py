#!/usr/bin/env python3
"""Decode speed with and without a constraint, at batch 1, against a running
`qwasi serve` (issue 24: constrained decoding should cost <= 10% on the GPU).

    python3 scripts/bench_structured.py --url http://127.0.0.1:8000 --runs 5 --tokens 256

Each run sends the same chat request twice, one at a time: unconstrained
(`ignore_eos`, so it decodes exactly --tokens tokens) and held to a regex
that accepts --tokens tokens' worth of text (`guided_regex`, also
`ignore_eos`). It prints one JSON line: the median decode tok/s of each and
the ratio. Decode time is the time after the first streamed token, so the
prefill and the constraint's compile are left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request


def stream_tok_s(url: str, body: dict) -> float:
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    first = last = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            v = json.loads(line[6:])
            if v.get("usage"):
                tokens = v["usage"]["completion_tokens"]
            elif v.get("choices"):
                now = time.monotonic()
                first = first or now
                last = now
    if not first or tokens < 2 or last == first:
        raise SystemExit(f"too few tokens streamed: {tokens}")
    return (tokens - 1) / (last - first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    with urllib.request.urlopen(f"{a.url}/v1/models") as r:
        model = json.load(r)["data"][0]["id"]
    base = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": a.tokens,
        "temperature": 0,
        "ignore_eos": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    # Letters and spaces, long enough that max_tokens ends it first.
    constrained = {**base, "guided_regex": "[A-Za-z ,.]{%d,}" % (8 * a.tokens)}
    free, held = [], []
    for _ in range(a.runs):
        free.append(stream_tok_s(a.url, base))
        held.append(stream_tok_s(a.url, constrained))
    f, h = statistics.median(free), statistics.median(held)
    print(json.dumps({"model": model, "tokens": a.tokens, "runs": a.runs,
                      "unconstrained_tok_s": round(f, 1), "constrained_tok_s": round(h, 1),
                      "constrained_over_unconstrained": round(h / f, 3)}))


if __name__ == "__main__":
    main()
