#!/usr/bin/env python3
"""The tables of scripts/device/prefill_precision.sh's results (run anywhere).

    python3 scripts/device/precision_table.py DIR [--json OUT.json]

DIR holds compare-{split,bf16}.json (`qwasi verify --compare`),
speed-{split,bf16}.json and optionally profile-{split,bf16}.json
(`qwasi bench --workload speed`). Prints the KL table (qwasi in each mode
against transformers f32 and bf16, and transformers bf16 against f32), TTFT
in both modes, and the prompt kernels whose time changed; with --json writes
them as one object.
"""

import argparse
import json
from pathlib import Path

MODES = ["split", "bf16"]


def load(d, name):
    p = Path(d) / name
    return json.loads(p.read_text()) if p.exists() else None


def kl_rows(d):
    rows = {}
    for m in MODES:
        c = load(d, f"compare-{m}.json")
        for r in (c or {}).get("compare", []):
            row = rows.setdefault(r["prompt_len"], {"prompt_len": r["prompt_len"]})
            row["hf_bf16_vs_hf_f32"] = r.get("kl_ref_bf16ref")
            row["hf_bf16_top1"] = r.get("bf16ref_top1_agree")
            row[f"{m}_vs_hf_f32"] = r["kl_ref_gpu"]
            row[f"{m}_vs_hf_bf16"] = r.get("kl_bf16ref_gpu")
            row[f"{m}_limit"] = r.get("kl_limit")
            row[f"{m}_teacher_forced"] = f"{r['decisive_agree']}/{r['decisive_steps']}"
            row[f"{m}_top1"] = r["top1_agree"]
            row[f"{m}_pass"] = r["pass"]
    return [rows[k] for k in sorted(rows)]


def ttft(d):
    out = {}
    for m in MODES:
        s = load(d, f"speed-{m}.json")
        for r in (s or {}).get("results", []):
            out.setdefault(r["prompt_len"], {})[m] = r["ttft_ms"]["median"]
            out[r["prompt_len"]][f"{m}_decode_tok_per_s"] = r["decode_tok_per_s"]["median"]
        if s:
            out.setdefault("correctness", {})[m] = s.get("correctness")
    return out


def profile(d):
    prof = {}
    for m in MODES + ["bf16-wg128", "bf16-mma"]:
        s = load(d, f"profile-{m}.json")
        if not s:
            continue
        for k in s["results"][0].get("prefill_profile_ms", []):
            prof.setdefault(k["kernel"], {})[m] = round(k["ms"], 2)
    return prof


def fmt(v):
    return "-" if v is None else f"{v:.2e}"


def yn(v):
    return "-" if v is None else ("yes" if v else "no")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--json")
    a = ap.parse_args()
    kl = kl_rows(a.dir)
    print(
        "| prompt | hf bf16 vs hf f32 | split vs hf f32 | split vs hf bf16 | bf16 vs hf f32 (limit) | bf16 vs hf bf16 "
        "| top-1 vs hf f32: hf bf16 / split / bf16 | teacher-forced split / bf16 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in kl:
        print(
            f"| {r['prompt_len']:,} | {fmt(r.get('hf_bf16_vs_hf_f32'))} | {fmt(r.get('split_vs_hf_f32'))} | "
            f"{fmt(r.get('split_vs_hf_bf16'))} | {fmt(r.get('bf16_vs_hf_f32'))} ({fmt(r.get('bf16_limit'))}) | "
            f"{fmt(r.get('bf16_vs_hf_bf16'))} | {yn(r.get('hf_bf16_top1'))} / {yn(r.get('split_top1'))} / "
            f"{yn(r.get('bf16_top1'))} | {r.get('split_teacher_forced')} / {r.get('bf16_teacher_forced')} |"
        )
    t = ttft(a.dir)
    print("\n| prompt | TTFT split (ms) | TTFT bf16 (ms) | speedup |")
    print("|---|---|---|---|")
    for L, v in sorted((k, v) for k, v in t.items() if k != "correctness"):
        if "split" in v and "bf16" in v:
            print(f"| {L:,} | {v['split']:.1f} | {v['bf16']:.1f} | {v['split'] / v['bf16']:.2f}x |")
    prof = profile(a.dir)
    if prof:
        print("\n| kernel (8K prompt, 40 layers) | split ms | bf16 ms | bf16, QWASI_MOE_GEMM=wg128 / mma |")
        print("|---|---|---|---|")
        for k, v in sorted(prof.items(), key=lambda kv: -max(kv[1].values())):
            if max(v.values()) - min(v.values()) >= 0.5 or "split" not in v or "bf16" not in v:
                ab = f"{v.get('bf16-wg128', '-')} / {v.get('bf16-mma', '-')}"
                print(f"| {k} | {v.get('split', '-')} | {v.get('bf16', '-')} | {ab} |")
        for m in MODES + ["bf16-wg128", "bf16-mma"]:
            tot = sum(v.get(m, 0) for v in prof.values())
            if tot:
                print(f"total prompt kernel time {m}: {tot:.1f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps({"kl": kl, "ttft_ms": t, "prefill_profile_ms": prof}, indent=1) + "\n")


if __name__ == "__main__":
    main()
